"""A Slurm job that ends under a run (scancel, its time limit): what Slurm said, read
into the run's one-line end, its exit status and its record."""
from __future__ import annotations

import sys
import time

import pytest

from multihost.errors import ConnectError, LaunchError, MultihostError
from multihost.events import NodeState
from multihost.hosts import Host
from multihost.job import JobOptions
from multihost.run import launchers as launch
from multihost.run.interrupts import Interrupts
from multihost.run.monitor import Monitor
from multihost.run.request import failure_of
from multihost.run.plan import build_plan
from multihost.run.records import NodeRecord, RunRecord, host_to_dict, load_run, new_run_id
from multihost.run.start import RecordKeeper
from multihost.slurm import ending
from multihost.slurm.ending import EXIT_SLURM_ENDED, JobEnd, ended, parse_scontrol

# Recorded in the Slurm lab (Slurm 22.05) a second after `salloc --time=1` ran out:
# the job is still COMPLETING, and its Reason says why.
TIMEOUT_LINE = "JobId=1 JobName=interactive UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) QOS=(null) JobState=COMPLETING Reason=TimeLimit Dependency=(null) Requeue=1 Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0 RunTime=00:01:00 TimeLimit=00:01:00 TimeMin=N/A SubmitTime=2026-11-27T18:01:06 EligibleTime=2026-11-27T18:01:06 AccrueTime=Unknown StartTime=2026-11-27T18:01:06 EndTime=2026-11-27T18:02:06 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-27T18:01:06 Scheduler=Main Partition=debug AllocNode:Sid=ctl:3798 ReqNodeList=(null) ExcNodeList=(null) NodeList=h[1-2] BatchHost=h1 NumNodes=2 NumCPUs=4 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=4,node=2,billing=4 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=NO Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/home/alice/exp Power="
CANCELLED_LINE = TIMEOUT_LINE.replace("JobState=COMPLETING Reason=TimeLimit",
                                      "JobState=CANCELLED Reason=None")


def test_a_time_limit_is_named_as_such_with_a_longer_time_to_ask_for():
    end = ended("1", parse_scontrol(TIMEOUT_LINE))
    assert end.line() == "Slurm job 1 reached its time limit (TIMEOUT) and Slurm ended every rank"
    assert end.fix(2, "20261127-1") == "ask for more time: salloc -N 2 --time=2 multihost rerun 20261127-1"
    # In a batch job, a batch job again.
    assert end.fix(2, "20261127-1", batch=True) == \
        "ask for more time: sbatch -N 2 --time=2 --wrap 'multihost rerun 20261127-1 --plain'"


def test_a_cancelled_job_is_named_as_cancelled_and_a_running_one_is_not_an_end():
    end = ended("1", parse_scontrol(CANCELLED_LINE))
    assert end.line() == "Slurm job 1 was cancelled (CANCELLED by scancel) and Slurm ended every rank"
    assert end.fix(3, "r1") == "salloc -N 3 multihost rerun r1"
    # Right after scancel the job is COMPLETING with no reason: a cancel too.
    assert JobEnd("1", "COMPLETING", "None").cause == "CANCELLED"
    running = TIMEOUT_LINE.replace("JobState=COMPLETING", "JobState=RUNNING")
    assert ended("1", parse_scontrol(running)) is None


class EndedJobCluster:
    """The nodes of Slurm job 7, every srun step of which now fails: the job is over."""

    class options:
        job_id = "7"

    def __init__(self, host):
        self.hosts = (host,)

    def transport(self, host):
        raise ConnectError("Slurm job 7 has ended", host=host.label, kind=ConnectError.LOST)

    def forget(self, host):
        pass


@pytest.fixture
def plan_record(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    host = Host("h1", rank=0, python=sys.executable, workdir=str(tmp_path))
    plan = build_plan(new_run_id(), [host], JobOptions(nproc_per_node=1),
                      launch.load_template("python"), ["job.py"], start_port=17000,
                      addresses=["198.18.0.11"], kill_wait=1.0)
    record = RunRecord(plan.run_id, time.time(), (NodeRecord(0, host_to_dict(host), host.label,
                                                             "198.18.0.11", 1, 0),),
                       plan.command, "python", "")
    return plan, record


def test_a_job_that_ran_out_of_time_ends_the_run_at_once_with_its_own_line(plan_record, monkeypatch):
    plan, record = plan_record
    asked = []
    monkeypatch.setattr(ending, "job_end",
                        lambda job: asked.append(job) or ended(job, parse_scontrol(TIMEOUT_LINE)))
    events = []
    began = time.monotonic()
    result = Monitor(EndedJobCluster(plan.nodes[0].host), plan, events.append, RecordKeeper(record),
                     Interrupts(), poll_interval=0.1, lost_after=30).watch_to_end()
    assert time.monotonic() - began < 5          # not the 30 s a lost host is waited for
    assert asked == ["7"]                         # Slurm asked once
    assert result.exit_code == EXIT_SLURM_ENDED == 143 and result.lost == ()
    error = failure_of(result, plan)
    assert str(error).startswith(f"run {plan.run_id} ended: Slurm job 7 reached its time limit "
                                 "(TIMEOUT) and Slurm ended every rank (fix: ask for more time: "
                                 "salloc -N 1 --time=2 ")
    assert error.exit_code == 143 and "multihost stop" not in str(error)
    saved = load_run(plan.run_id)
    assert saved.state.value == "stopped" and saved.exit_code == 143
    assert "reached its time limit (TIMEOUT)" in saved.root_cause.reason
    assert saved.nodes[0].state == "stopped" and "Slurm" in saved.nodes[0].detail
    assert not any("contact lost" in getattr(e, "detail", "") for e in events)


def test_a_job_that_still_runs_leaves_the_lost_host_to_the_usual_wait(plan_record, monkeypatch):
    plan, record = plan_record
    monkeypatch.setattr(ending, "job_end", lambda job: None)
    result = Monitor(EndedJobCluster(plan.nodes[0].host), plan, lambda e: None, RecordKeeper(record),
                     Interrupts(), poll_interval=0.1, lost_after=0.5).watch_to_end()
    assert result.exit_code == 255 and result.lost == (0,) and result.root_cause.kind == "lost"


class LaunchCluster(EndedJobCluster):
    """Job 7's nodes as a launch meets them: each launch answers, then scancel comes and
    the step that confirms the launch is cancelled."""

    def map(self, operation, hosts):
        from multihost.fanout import HostResult

        results = []
        for host in hosts:
            try:
                results.append(HostResult(host, operation(host, None)))
            except MultihostError as err:
                results.append(HostResult(host, error=err))
            except AttributeError:   # the rollback's stop: no node answers any more
                results.append(HostResult(host, error=ConnectError("gone", host=host.label,
                                                                    kind=ConnectError.LOST)))
        return results


def test_a_job_cancelled_during_the_launch_ends_the_run_in_slurms_words(plan_record, monkeypatch):
    from multihost.errors import RunFailed
    from multihost.run.start import Starter

    plan, record = plan_record
    monkeypatch.setattr(ending, "job_end", lambda job: ended(job, parse_scontrol(CANCELLED_LINE)))
    events = []
    starter = Starter(LaunchCluster(plan.nodes[0].host), plan, events.append, RecordKeeper(record))
    starter.prepared = {0: None}
    monkeypatch.setattr(starter, "_launch_one", lambda host, t: {"started": time.time()})

    def cancelled(host, t):
        raise LaunchError("helper operation 'run.launched' failed: slurmstepd-h1: error: "
                          "*** STEP 7.3 ON h1 CANCELLED AT 2026-11-27T20:08:33 ***", host="h1")

    monkeypatch.setattr(starter, "_confirm_one", cancelled)
    monkeypatch.setattr(Starter, "launch_timeout", property(lambda self: 120.0))
    with pytest.raises(RunFailed) as raised:
        starter.launch()
    assert str(raised.value).startswith(f"run {plan.run_id} ended: Slurm job 7 was cancelled "
                                        "(CANCELLED by scancel) and Slurm ended every rank")
    assert raised.value.exit_code == 143
    assert not [e for e in events if getattr(e, "state", None) == NodeState.FAILED]
    saved = load_run(plan.run_id)
    assert saved.state.value == "stopped" and saved.exit_code == 143
    assert saved.root_cause.kind == "slurm"
