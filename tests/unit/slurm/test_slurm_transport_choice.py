"""Which hosts a command takes and how it reaches them, inside and outside Slurm; the
srun line a node's command becomes."""
from __future__ import annotations

import pytest

from multihost.errors import ConfigError
from multihost.hosts import Host
from multihost.slurm import plan, with_allocation_gpus
from multihost.transport.srun import clean_stderr, srun_argv

ALLOC = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "gpu[2-3]", "SLURM_GPUS_ON_NODE": "2"}


def test_inside_an_allocation_with_no_hosts_given_the_nodes_are_reached_by_srun():
    p = plan(None, None, None, ALLOC, scontrol="")
    assert (p.transport, p.ips, p.allocation.job_id) == ("srun", "gpu2,gpu3", "12")
    # --transport ssh: the same nodes, over ssh
    p = plan("ssh", None, None, ALLOC, scontrol="")
    assert (p.transport, p.ips) == ("ssh", "gpu2,gpu3")


def test_hosts_given_are_reached_by_ssh_unless_srun_is_asked_for():
    assert plan(None, "a,b", None, ALLOC, scontrol="").transport == "ssh"
    assert plan("ssh", None, "hosts.ini", ALLOC, scontrol="").ips is None
    p = plan("srun", "gpu3", None, ALLOC, scontrol="")
    assert (p.transport, p.ips, p.allocation.job_id) == ("srun", None, "12")


def test_outside_an_allocation_nothing_changes_and_srun_is_refused_with_a_fix():
    p = plan(None, None, None, {}, scontrol="")
    assert (p.transport, p.ips, p.allocation) == ("ssh", None, None)
    with pytest.raises(ConfigError) as err:
        plan("srun", "a,b", None, {}, scontrol="")
    assert "salloc" in err.value.fix


def test_hosts_take_the_allocations_gpus_unless_they_say_their_own():
    alloc = plan(None, None, None, ALLOC, scontrol="").allocation
    hosts = with_allocation_gpus([Host("gpu2"), Host("gpu3", rank=1, gpus=(1,))], alloc)
    assert [h.gpus for h in hosts] == [(0, 1), (1,)]


def test_a_node_command_is_one_overlapping_task_on_that_node():
    argv = srun_argv("gpu3", "12", "echo hi")
    assert argv[0] == "srun" and "--overlap" in argv
    assert argv[argv.index("-w") + 1] == "gpu3" and argv[argv.index("--jobid") + 1] == "12"
    assert "--nodes=1" in argv and "--ntasks=1" in argv
    assert argv[-3:-1] == ["/bin/sh", "-c"] and argv[-1].endswith("echo hi")


def test_sruns_own_report_of_a_task_exit_is_not_the_commands_stderr():
    err = (b"real error\nsrun: error: gpu3: task 0: Exited with exit code 3\n"
           b"srun: error: gpu3: task 0: Killed\nsrun: error: Unable to create step for job 12\n")
    assert clean_stderr(err) == b"real error\nsrun: error: Unable to create step for job 12\n"


def test_a_step_that_srun_could_not_start_is_a_connect_error_with_the_cause():
    from multihost.errors import ConnectError
    from multihost.transport.srun import step_error

    gone = step_error(b"srun: error: Unable to confirm allocation for job 3: Invalid job id "
                      b"specified\nsrun: Check SLURM_JOB_ID environment variable. Expired or "
                      b"invalid job 3\n", "h1", "3")
    assert gone.kind == ConnectError.LOST and "Slurm job 3 has ended" in gone.cause
    assert "salloc" in gone.fix
    assert step_error(b"srun: error: Slurm job 4 has expired\n", "h1", "4").kind == ConnectError.LOST
    elsewhere = step_error(b"srun: error: Unable to create step for job 12: Requested node "
                           b"configuration is not available\n", "h9", "12")
    assert elsewhere.kind == ConnectError.UNREACHABLE and "squeue -j 12" in elsewhere.fix
    assert step_error(b"Traceback ...\nValueError: x\n", "h1", "3") is None


def test_a_runs_record_keeps_how_its_nodes_were_reached():
    from multihost.transport import SrunOptions, SshOptions
    from multihost.transport.srun import from_record, record_fields

    srun = SrunOptions(connect_timeout=5.0, job_id="41")
    ssh = {"connect_timeout": 5.0, **record_fields(srun)}
    again = from_record(ssh, SshOptions(connect_timeout=7.0))
    assert isinstance(again, SrunOptions) and again.job_id == "41" and again.connect_timeout == 7.0
    assert record_fields(SshOptions()) == {}
    plain = SshOptions()
    assert from_record({"connect_timeout": 5.0}, plain) is plain


def test_through_srun_each_node_takes_the_gpus_a_step_sees_there(tmp_path):
    # A stand-in srun: gpu2's steps see the devices renumbered (cgroups), gpu3's do not
    # answer; every host that does not say its GPUs is asked.
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\nfor a; do case $a in gpu2) echo 0,1;; gpu3) exit 1;; esac; done\n")
    fake.chmod(0o755)
    alloc = plan(None, None, None, dict(ALLOC, SLURM_JOB_GPUS="4,5"), scontrol="").allocation
    hosts = [Host("gpu2"), Host("gpu3", rank=1), Host("gpu4", rank=2, gpus=(7,))]
    got = with_allocation_gpus(hosts, alloc, "srun", srun=str(fake))
    assert [h.gpus for h in got] == [(0, 1), (4, 5), (7,)]
    # over ssh the launcher is no step: the allocation's own indexes
    assert [h.gpus for h in with_allocation_gpus(hosts, alloc, "ssh", srun=str(fake))] == \
        [(4, 5), (4, 5), (7,)]
