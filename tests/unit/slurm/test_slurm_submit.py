"""`run --slurm`: the request salloc gets, and what is refused before Slurm is asked."""
from __future__ import annotations

import pytest

from multihost.errors import ConfigError
from multihost.slurm.submit import Ask, in_allocation, queued_line, salloc_argv


def test_the_request_names_nodes_and_only_the_limits_given():
    assert salloc_argv(Ask(4)) == ["salloc", "--no-shell", "--nodes=4", "--job-name=multihost"]
    argv = salloc_argv(Ask(2, partition="a100", time="1:00:00", gres="gpu:8"))
    assert argv[-3:] == ["--partition=a100", "--time=1:00:00", "--gres=gpu:8"]


def test_inside_an_allocation_slurm_is_not_asked_again(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    with pytest.raises(ConfigError) as err:
        with in_allocation(Ask(2), print):
            pass
    assert "77" in err.value.cause and "leave out --slurm" in err.value.fix


def test_a_queued_run_says_its_job_and_slurms_reason():
    assert queued_line({"job_id": "1234", "reason": "Priority"}) == "queued (Slurm job 1234, Priority)"
