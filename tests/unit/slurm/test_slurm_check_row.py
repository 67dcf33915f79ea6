"""check's ssh row for a node reached by srun: what was done, and srun's own failures."""
from __future__ import annotations

from multihost.check.checks.host import judge_ssh
from multihost.check.judge import HostProbe
from multihost.check.report import FAIL, PASS
from multihost.hosts import Host
from multihost.transport.srun import step_error


def test_a_node_reached_by_srun_says_it_ran_a_step_not_a_login():
    row = judge_ssh(HostProbe(Host("h1"), via="srun", ssh_ms=84.2), None)
    assert (row.status, row.detail, row.brief) == (PASS, "srun step in 84 ms", "srun")
    row = judge_ssh(HostProbe(Host("10.0.0.1"), ssh_ms=12.0), None)
    assert row.detail == "password-free login in 12 ms"


def test_srun_failures_are_srun_words_with_slurm_fixes():
    gone = step_error(b"srun: error: Unable to confirm allocation for job 7: Invalid job id "
                      b"specified\n", "h1", "7")
    row = judge_ssh(HostProbe(Host("h1"), via="srun", ssh_error=gone), None)
    assert row.status == FAIL and row.brief == "job ended"
    assert row.detail.startswith("Slurm job 7 has ended") and "salloc again" in row.fix
    busy = step_error(b"srun: error: Unable to create step for job 7: Requested node "
                      b"configuration is not available\n", "h3", "7")
    row = judge_ssh(HostProbe(Host("h3"), via="srun", ssh_error=busy), None)
    assert row.brief == "srun failed" and "srun could not start a step of Slurm job 7" in row.detail
    assert row.fix == "check that h3 is a node of the job: squeue -j 7 -o %N"
