"""The allocation as multihost reads it: Slurm's node lists expanded in Slurm's order,
the GPUs from the allocation, nothing outside one."""
from __future__ import annotations

import os
import stat

import pytest

from multihost.errors import ConfigError
from multihost.slurm import allocated_gpus, current, expand_nodelist

# What `scontrol show hostnames` (Slurm 22.05) printed for each list, on the Slurm lab.
SLURM_SAYS = {
    "h[1-3,5],g7": "h1 h2 h3 h5 g7",
    "linux[0-6,128]": "linux0 linux1 linux2 linux3 linux4 linux5 linux6 linux128",
    "node[08-11]": "node08 node09 node10 node11",
    "rack[0-1]_blade[0-1]": "rack0_blade0 rack0_blade1 rack1_blade0 rack1_blade1",
    "tux[7,3-4]": "tux7 tux3 tux4",
    "gpu-node-[001-002]": "gpu-node-001 gpu-node-002",
    "a[1-2],b": "a1 a2 b",
    "a[01-3]": "a01 a02 a03",
    "h1": "h1",
}


@pytest.mark.parametrize("text", sorted(SLURM_SAYS))
def test_without_scontrol_a_node_list_expands_as_slurm_does(text):
    assert expand_nodelist(text, scontrol="") == tuple(SLURM_SAYS[text].split())


def test_a_bad_node_list_is_refused_with_a_fix():
    for bad in ("x[10-8]", "h[1-2", ""):
        with pytest.raises(ConfigError) as err:
            expand_nodelist(bad, scontrol="")
        assert err.value.fix


def test_scontrol_is_asked_first_and_its_order_kept(tmp_path):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] && printf 'b2\\na1\\n'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert expand_nodelist("a1,b2", scontrol=str(fake)) == ("b2", "a1")
    # An scontrol that fails (no config reachable) leaves it to the parser.
    fake.write_text("#!/bin/sh\necho 'fatal: Could not establish a configuration source' >&2; exit 1\n")
    assert expand_nodelist("a[1-2]", scontrol=str(fake)) == ("a1", "a2")


def test_the_allocation_from_salloc_environment():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[3-4],gpu1",
           "SLURM_JOB_PARTITION": "a100", "SLURM_JOB_GPUS": "0,1,2,3"}
    alloc = current(env, scontrol="")
    assert alloc.job_id == "42" and alloc.partition == "a100" and not alloc.in_step
    assert alloc.nodes == ("gpu3", "gpu4", "gpu1")
    assert alloc.gpus == (0, 1, 2, 3)
    # The old names, as older Slurm and some sites' wrappers set them.
    assert current({"SLURM_JOBID": "7", "SLURM_NODELIST": "n[1-2]"}, scontrol="").nodes == ("n1", "n2")


def test_outside_an_allocation_there_is_none():
    assert current({}, scontrol="") is None
    assert current({"SLURM_JOB_ID": "3"}, scontrol="") is None


def test_gpus_come_from_the_step_then_the_job_then_the_count():
    # Under srun Slurm sets the step's own devices; they win over the job's list.
    assert allocated_gpus({"SLURM_STEP_ID": "0", "CUDA_VISIBLE_DEVICES": "2,3",
                           "SLURM_JOB_GPUS": "0,1,2,3"}) == (2, 3)
    # salloc's shell is not a step: a CUDA_VISIBLE_DEVICES there is the user's own.
    assert allocated_gpus({"CUDA_VISIBLE_DEVICES": "5", "SLURM_JOB_GPUS": "0,1"}) == (0, 1)
    assert allocated_gpus({"SLURM_GPUS_ON_NODE": "8"}) == tuple(range(8))
    assert allocated_gpus({}) is None
