"""Following a run to its end: the events a view gets, the root cause of a failure,
Ctrl-C, --wait, and a host that stops answering. Real processes on this machine through
the local transport (a lost host is simulated: this machine can not lose itself)."""
from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from multihost.run import launchers as launch
from multihost.errors import ConnectError
from multihost.events import LogLine, NodeChanged, NodeState, RunFinished, RunStarted, RunStopping
from multihost.fanout import HostGroup
from multihost.hosts import Host
from multihost.job import JobOptions
from multihost.run.interrupts import Interrupts
from multihost.run.monitor import Monitor
from multihost.run.execute import RunOptions, launch_and_watch
from multihost.run.plan import build_plan
from multihost.run.start import RecordKeeper
from multihost.run.records import NodeRecord, RunRecord, host_to_dict, load_run, new_run_id

JOB = """\
import os, sys, time
rank = int(os.environ["RANK"])
print("rank", rank, "says hello", flush=True)
mode = sys.argv[1]
if mode == "fail" and rank == 1:
    time.sleep(0.5)
    print("rank 1 gives up", flush=True)
    sys.exit(3)
if mode == "first-done" and rank == 0:
    sys.exit(0)
time.sleep(0 if mode == "ok" else 600)
"""


@pytest.fixture
def host(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "job.py").write_text(JOB)
    return Host("127.0.0.1", rank=0, python=sys.executable, workdir=str(tmp_path / "work"))


def lines_of(event):
    """The log lines an event carries (followers send single lines or blocks of them)."""
    if isinstance(event, LogLine):
        return [event.text]
    return list(getattr(event, "lines", ()) or ()) if type(event).__name__ == "LogBlock" else []


def plan_and_record(host, mode, grace=1.0, log_dir=""):
    plan = build_plan(new_run_id(), [host], JobOptions(nproc_per_node=2),
                      launch.load_template("python"), ["job.py", mode], start_port=17000,
                      addresses=["127.0.0.1"], kill_wait=grace)
    record = RunRecord(plan.run_id, time.time(), (NodeRecord(0, host_to_dict(host), host.label,
                                                             "127.0.0.1", 2, 0),),
                       plan.command, "python", "", log_dir=log_dir)
    return plan, record


def keeping(plan_record):
    """(plan, the keeper of its record), as the lifecycle gives them to the execute step."""
    plan, record = plan_record
    return plan, RecordKeeper(record, make_last=False)


def follow(host, mode, options=RunOptions(poll_interval=0.2), during=None, log_dir=""):
    events = []
    plan, record = plan_and_record(host, mode, log_dir=log_dir)
    with HostGroup([host]) as cluster:
        if during:
            threading.Timer(1.5, during).start()
        outcome = launch_and_watch(cluster, *keeping((plan, record)), events.append, options)
    return outcome, events, plan


def test_a_successful_run_tells_the_view_everything_in_order(host, tmp_path):
    result, events, plan = follow(host, "ok", log_dir=str(tmp_path / "mirror"))
    assert result.exit_code == 0 and result.root_cause is None
    assert isinstance(events[0], RunStarted) and events[0].hosts == ("127.0.0.1",)
    states = [e.state for e in events if isinstance(e, NodeChanged)]
    assert states == [NodeState.LAUNCHING, NodeState.RUNNING, NodeState.SUCCEEDED]
    assert isinstance(events[-1], RunFinished) and events[-1].exit_code == 0
    # Every rank's lines came through the log follower before the end, and were mirrored.
    lines = [line for e in events for line in lines_of(e)]
    assert {"rank 0 says hello", "rank 1 says hello"} <= set(lines)
    assert (tmp_path / "mirror" / "127.0.0.1" / "log" / "workerlog.1").read_text() == \
        "rank 1 says hello\n"
    record = load_run(None)
    assert record.run_id == plan.run_id and record.state == "succeeded"
    assert record.nodes[0].state == "succeeded" and record.node0_argv.endswith("job.py ok")


def test_a_failing_rank_is_the_root_cause_with_its_last_lines(host):
    result, events, plan = follow(host, "fail")
    assert result.exit_code == 3
    cause = events[-1].root_cause
    assert (cause.host, cause.node_rank, cause.rank, cause.reason) == ("127.0.0.1", 0, 1, "exit 3")
    assert cause.tail == ("rank 1 says hello", "rank 1 gives up")
    record = load_run(plan.run_id)
    assert record.state == "failed" and record.exit_code == 3
    assert record.root_cause.rank == 1 and record.root_cause.local_rank == 1


def test_ctrl_c_stops_the_run_and_exits_130(host):
    holder, events = {}, []
    plan, record = plan_and_record(host, "sleep")

    def interrupt():
        holder["controls"].interrupts.count += 1      # what the SIGINT handler does

    def listen(event):
        # Ctrl-C a moment after the node runs, however long a loaded machine took to
        # launch it (a Ctrl-C during the launch ends in KeyboardInterrupt: tested below).
        events.append(event)
        if isinstance(event, NodeChanged) and event.state == NodeState.RUNNING \
                and not holder.get("asked"):
            holder["asked"] = True
            threading.Timer(0.5, interrupt).start()

    with HostGroup([host]) as cluster:
        outcome = launch_and_watch(cluster, *keeping((plan, record)), listen,
                                   RunOptions(poll_interval=0.2), holder)
    assert outcome.exit_code == 130 and outcome.interrupted
    assert outcome.states == ("stopped",)
    assert load_run(plan.run_id).state == "stopped"
    # Acknowledged before the host had stopped: the row says "stopping" in between.
    stopping = [e for e in events if isinstance(e, RunStopping)]
    assert len(stopping) == 1 and stopping[0].hosts == 1 and stopping[0].grace == 1.0
    states = [e.state for e in events if isinstance(e, NodeChanged)]
    assert states[-2:] == [NodeState.STOPPING, NodeState.STOPPED]
    assert events.index(stopping[0]) < len(events) - 2


def test_ctrl_c_during_the_launch_is_recorded_with_the_130_run_exits_with(host):
    holder, plan_record = {}, plan_and_record(host, "sleep")

    def interrupt_on_launch(event):
        if isinstance(event, NodeChanged) and event.state == NodeState.LAUNCHING:
            holder["controls"].interrupts.count += 1

    with HostGroup([host]) as cluster, pytest.raises(KeyboardInterrupt):
        launch_and_watch(cluster, *keeping(plan_record), interrupt_on_launch,
                         RunOptions(poll_interval=0.2), holder)
    record = load_run(plan_record[0].run_id)
    assert record.state == "stopped" and record.exit_code == 130


def test_ctrl_c_once_every_node_runs_stops_the_run_as_a_running_one(host):
    # The moment between a node's "running" and the word that every node launched: the
    # run has started, so it ends as any Ctrl-C ends a run (stopped on every host), not
    # as a launch that "did not start everywhere".
    holder, plan_record = {}, plan_and_record(host, "sleep")

    def interrupt_once_running(event):
        if isinstance(event, NodeChanged) and event.state == NodeState.RUNNING:
            holder["controls"].interrupts.count += 1

    with HostGroup([host]) as cluster:
        outcome = launch_and_watch(cluster, *keeping(plan_record), interrupt_once_running,
                                   RunOptions(poll_interval=0.2), holder)
    assert outcome.exit_code == 130 and outcome.interrupted
    record = load_run(plan_record[0].run_id)
    assert record.state == "stopped" and "did not start" not in record.nodes[0].detail


def test_the_dashboards_stop_is_recorded_as_such_not_as_ctrl_c(host):
    holder = {}
    plan, record = plan_and_record(host, "sleep")
    with HostGroup([host]) as cluster:
        def stop_once_running(event):
            # The dashboard's stop key, pressed once the node runs (a stop during the
            # launch itself is Ctrl-C's business, tested elsewhere).
            if isinstance(event, NodeChanged) and event.state == NodeState.RUNNING \
                    and not holder.get("stopped"):
                holder["stopped"] = True
                threading.Timer(0.3, lambda: holder["controls"].stop()).start()
        outcome = launch_and_watch(cluster, *keeping((plan, record)), stop_once_running,
                                   RunOptions(poll_interval=0.2), holder)
    assert outcome.exit_code == 143 and not outcome.interrupted
    node = load_run(plan.run_id).nodes[0]
    assert node.state == "stopped" and "from the dashboard" in node.detail
    assert "Ctrl-C" not in node.detail


def test_wait_ends_the_run_after_the_first_rank_exits(host):
    began = time.monotonic()
    result, events, _ = follow(host, "first-done",
                               RunOptions(poll_interval=0.2, wait_after_exit=0.5))
    assert time.monotonic() - began < 15
    assert result.exit_code == 1 and result.root_cause.kind == "wait"
    assert "--wait" in events[-1].root_cause.reason


def test_detach_returns_while_the_run_goes_on(host):
    plan, record = plan_and_record(host, "sleep")
    with HostGroup([host]) as cluster:
        outcome = launch_and_watch(cluster, *keeping((plan, record)), lambda e: None,
                                   RunOptions(detach=True))
        assert outcome.detached
        assert load_run(plan.run_id).state == "running"
        from multihost.run.control import query, stop

        assert query(cluster, load_run(plan.run_id)).nodes[0].state == "running"
        status = stop(cluster, load_run(plan.run_id), 0.5, "test")
    assert status.nodes[0].state == "stopped" and status.record.state == "stopped"


class DeadCluster:
    """A cluster whose host stopped answering after the launch."""

    def __init__(self, host):
        self.hosts = (host,)

    def transport(self, host):
        raise ConnectError("no answer from 10.0.0.9:22 within 1s", host=host.label,
                           kind=ConnectError.TIMEOUT)

    def forget(self, host):
        pass


def test_a_host_that_stops_answering_is_lost_and_the_run_exits_255(host):
    plan, record = plan_and_record(host, "sleep")
    events = []
    monitor = Monitor(DeadCluster(host), plan, events.append, RecordKeeper(record), Interrupts(),
                      poll_interval=0.1, lost_after=0.5)
    began = time.monotonic()
    result = monitor.watch_to_end()
    assert 0.5 <= time.monotonic() - began < 3
    assert result.exit_code == 255 and result.lost == (0,)
    assert result.root_cause.kind == "lost"
    lost = [e for e in events if isinstance(e, NodeChanged) and e.state == NodeState.LOST]
    assert "no answer for 0.5s (no answer from 10.0.0.9:22 within 1s)" in lost[0].detail
    assert load_run(plan.run_id).nodes[0].state == "lost"


def test_a_teardown_reaches_each_host_through_its_watch_stream(host, tmp_path, monkeypatch):
    """Stopping costs no new session and no new helper per host (64 of each made a
    64-host teardown miss its grace + 3 s): the stop goes on the status stream."""
    from multihost import helper

    ops, real_call = [], helper.call
    monkeypatch.setattr(helper, "call", lambda t, op, *a, **k: (ops.append(op),
                                                               real_call(t, op, *a, **k))[1])
    holder, events = {}, []
    plan, record = plan_and_record(host, "sleep", log_dir=str(tmp_path / "mirror"))

    def listen(event):  # Ctrl-C once the ranks' first lines arrive: the run is followed
        events.append(event)
        if lines_of(event) and not holder.get("interrupted"):
            holder["interrupted"] = True
            holder["controls"].interrupts.count += 1

    with HostGroup([host]) as cluster:
        outcome = launch_and_watch(cluster, *keeping((plan, record)), listen,
                                   RunOptions(poll_interval=0.2), holder)
    assert outcome.exit_code == 130 and outcome.states == ("stopped",)
    assert load_run(plan.run_id).nodes[0].state == "stopped"
    assert "run.stop" not in ops


class FakeStream:
    """A watch stream that ends at once, keeping what the monitor wrote to it."""

    def __init__(self):
        self.stdin, self.stdout, self.written = self, self, b""

    def write(self, data):
        self.written += data

    def flush(self):
        pass

    def readline(self, size=-1):
        return b""

    def started(self):
        pass

    def set_timeout(self, seconds):
        pass

    def close(self):
        pass


def test_a_stop_asked_while_a_hosts_stream_is_down_goes_on_the_reopened_stream(host, monkeypatch):
    from multihost import helper

    plan, record = plan_and_record(host, "sleep")
    monitor = Monitor(DeadCluster(host), plan, lambda event: None, RecordKeeper(record),
                      Interrupts())
    streams = monitor.status_streams
    assert not streams.stop_by_stream(host, 2.0, "teardown: a host failed")  # no stream yet
    opened = []

    def start(transport, op, request):
        opened.append((op, request, FakeStream()))
        monitor.stop_polling.set()   # one stream is enough: the watch ends with it
        return opened[-1][2]

    monkeypatch.setattr(DeadCluster, "transport", lambda self, h: object())
    monkeypatch.setattr(helper, "start", start)
    monitor.status_streams.watch(host)
    (op, request, stream), = opened
    assert op == "run.watch" and request["stoppable"] is True
    assert json.loads(stream.written) == {"stop": {"grace": 2.0, "reason": "teardown: a host failed"}}
