"""The rank that crashed is the root cause even on a loaded machine, where its end is
recorded late and its host's status comes after the others': not a neighbour that
torchrun ended with SIGTERM, nor a peer whose collective lost it."""
from __future__ import annotations

import re
import sys
import time

import pytest

from multihost.hosts import Host
from multihost.job import JobOptions
from multihost.run import launchers as launch
from multihost.run.interrupts import Interrupts
from multihost.run.monitor import Monitor
from multihost.run.outcome import parse_status
from multihost.run.plan import build_plan
from multihost.run.records import NodeRecord, RunRecord, host_to_dict, new_run_id
from multihost.run.start import RecordKeeper

# What a rank printed last (recorded in the Slurm lab: train_ddp.py --crash-at 30, 2 x 2
# ranks, gloo): the crash itself, and a peer whose all-reduce lost it.
CRASH = ("epoch: 0, step:25, train_loss: 0.387500", "rank 3 crashes at step 30 (--crash-at)")
RESET = ("[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
         "pair.cc:537] Read error [198.18.0.12]:10385: Connection reset by peer. This is "
         "typically caused by a remote worker hanging or bugs in the application.",)


def rank(local, global_rank, ended, exit_code=None, signal=None, exiting=None):
    return {"local_rank": local, "rank": global_rank, "pid": 100 + global_rank, "started": 1.0,
            "ended": ended, "exit_code": exit_code, "signal": signal, "exiting": exiting}


def victim_of_the_crash(global_rank):
    return tuple(line.replace("rank1", f"rank{global_rank}") for line in RESET)


# h1: rank 1's all-reduce lost rank 3 (it began to exit at 100.4, its exit mark); torchrun
# then ended rank 0 with SIGTERM. Both before multihost's stop reached h1.
NEIGHBOUR_ENDED = (
    {"state": "failed", "node": {"state": "failed", "exit_code": 1, "ended": 101.5},
     "ranks": [rank(0, 0, 100.9, signal=15), rank(1, 1, 100.6, 1, exiting=100.4)]},
    # h2: rank 3 crashed (os._exit: no exit mark, dated by its wrapper, late on a loaded
    # machine); rank 2's all-reduce lost it and began to exit before that date.
    {"state": "failed", "node": {"state": "failed", "exit_code": 1, "ended": 101.8,
                                 "stopping": 101.0},
     "ranks": [rank(0, 2, 100.7, 1, exiting=100.5), rank(1, 3, 100.8, 1)]},
    {(0, 1): RESET, (1, 0): victim_of_the_crash(2), (1, 1): CRASH})
# As the lab recorded it under load: h1's rank 0 lost rank 3 and began to exit first, and
# a SIGTERM (its launcher's, or multihost's stop) ended it in its exit; its neighbour was
# still in the all-reduce when the stop came. On h2 the same befell rank 2.
ENDED_IN_ITS_EXIT = (
    {"state": "failed", "node": {"state": "failed", "exit_code": 1, "ended": 101.5,
                                 "stopping": 101.0},
     "ranks": [rank(0, 0, 100.9, signal=15, exiting=100.3), rank(1, 1, 101.2, signal=15)]},
    {"state": "failed", "node": {"state": "failed", "exit_code": 1, "ended": 101.8},
     "ranks": [rank(0, 2, 100.9, signal=15, exiting=100.5), rank(1, 3, 100.8, 1)]},
    {(0, 0): victim_of_the_crash(0), (1, 0): victim_of_the_crash(2), (1, 1): CRASH})


class QuietStreams:
    """The hosts' status streams: the test hands the monitor their answers itself."""

    def __init__(self):
        self.stopped = []

    def stop(self, host, grace, reason):
        self.stopped.append(host.label)

    def close_all(self):
        pass


@pytest.fixture(params=[NEIGHBOUR_ENDED, ENDED_IN_ITS_EXIT], ids=["neighbour", "in-its-exit"])
def loaded(request, tmp_path, monkeypatch):
    """A monitor of 2 hosts x 2 ranks, and what the hosts answer after rank 3 crashed."""
    monkeypatch.setenv("HOME", str(tmp_path))
    hosts = [Host(f"h{i + 1}", rank=i, python=sys.executable, workdir=str(tmp_path))
             for i in range(2)]
    plan = build_plan(new_run_id(), hosts, JobOptions(nproc_per_node=2),
                      launch.load_template("torchrun"), ["train.py"], start_port=17000,
                      addresses=["198.18.0.11", "198.18.0.12"], kill_wait=1.0)
    record = RunRecord(plan.run_id, time.time(),
                       tuple(NodeRecord(h.rank, host_to_dict(h), h.label, f"198.18.0.1{h.rank + 1}",
                                        2, 2 * h.rank) for h in hosts),
                       plan.command, "torchrun", "")
    watcher = Monitor(None, plan, lambda event: None, RecordKeeper(record), Interrupts(),
                      lost_after=30)
    watcher.status_streams = QuietStreams()
    *replies, tails = request.param

    def status_with_tail(node_rank, local_rank):   # what `run.status` with tails answers
        reply = dict(replies[node_rank])
        reply["tails"] = {str(local): list(lines) for (node, local), lines in tails.items()
                          if node == node_rank}
        return parse_status(reply)
    watcher._status_with_tail = status_with_tail
    return watcher, replies


def hear(monitor, node_rank, reply):
    """A host's status arrives, and the monitor decides on what it heard so far."""
    monitor._take(("status", node_rank, parse_status(reply), time.time()))
    monitor._decide(time.time())


def test_the_crashed_rank_is_the_root_cause_when_its_hosts_status_comes_last(loaded):
    monitor, (h1, h2) = loaded
    hear(monitor, 0, h1)   # the loaded host h2 answers late: the run is stopped before
    assert monitor.status_streams.stopped == ["h2"]
    hear(monitor, 1, h2)
    cause = monitor._finish().root_cause
    assert (cause.host, cause.rank, cause.exit_code, cause.reason) == ("h2", 3, 1, "exit 1")
    assert cause.tail == CRASH
    # ... and the rank blamed before is told as stopped after it.
    assert any(re.match(r"h1 \(node 0\) ranks? 0\b.*: killed by SIGTERM, stopped after rank 3 "
                        r"failed", line) for line in cause.after), cause.after
