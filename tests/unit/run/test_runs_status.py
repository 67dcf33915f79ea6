"""`status` of a run whose controller is gone: the hosts' answers reconciled into the
record (final state, exit status, root cause), and the table a user reads."""
from __future__ import annotations

import io

from multihost.run import records as runs
from multihost.views.status_view import render_plain as print_plain
from multihost.hosts import Host
from multihost.run.control import NodeStatus, RunStatus, reconcile
from multihost.run.outcome import parse_status
from multihost.errors import ConnectError


def record(state="running") -> runs.RunRecord:
    hosts = [Host(f"10.0.0.{i + 1}", rank=i) for i in range(3)]
    nodes = tuple(runs.NodeRecord(h.rank, runs.host_to_dict(h), h.label, h.name, 2, 2 * h.rank,
                                  state="running") for h in hosts)
    return runs.RunRecord("20250101-120000-ab12", 1.0, nodes, ("train.py", "--lr", "0.1"),
                          "torchrun", "", start_port=17000, world_size=6, state=state)


def reply(state, ranks=(), ended=100.0, exit_code=None, signal=None, detail=""):
    return parse_status({"state": state, "detail": detail, "procs": 0,
                         "node": {"state": state, "ended": ended, "exit_code": exit_code,
                                  "signal": signal, "started": 50.0},
                         "ranks": [dict(local_rank=l, rank=r, ended=e, exit_code=c, signal=s)
                                   for l, r, e, c, s in ranks]})


def status_of(*views):
    rec = record()
    return rec, tuple(NodeStatus(i, rec.nodes[i].label, 2, 2 * i, view=v)
                      for i, v in enumerate(views))


def test_a_run_that_ended_without_its_controller_gets_its_root_cause():
    rec, nodes = status_of(
        reply("stopped", [(0, 0, 92.0, None, 15), (1, 1, 92.1, None, 15)]),
        reply("failed", [(0, 2, 90.0, 3, None), (1, 3, 91.0, None, 15)], exit_code=1),
        reply("failed", [(0, 4, 90.5, 1, None)], exit_code=1))   # a follow-on error
    final = reconcile(rec, nodes)
    assert (final.state, final.exit_code) == ("failed", 3)
    assert final.root_cause.host == "10.0.0.2" and final.root_cause.rank == 2
    assert [n.state for n in final.nodes] == ["stopped", "failed", "failed"]


def test_a_run_still_running_somewhere_is_not_final():
    rec, nodes = status_of(reply("succeeded"), reply("running"), reply("succeeded"))
    final = reconcile(rec, nodes)
    assert final.state == "running" and final.exit_code is None
    assert final.nodes[0].state == "succeeded"


def test_stopped_everywhere_and_succeeded_everywhere():
    assert reconcile(*status_of(*[reply("stopped")] * 3)).exit_code == 143
    done = reconcile(*status_of(*[reply("succeeded", exit_code=0)] * 3))
    assert (done.state, done.exit_code, done.root_cause) == ("succeeded", 0, None)


def test_the_plain_table_names_each_node_its_ranks_and_what_went_wrong():
    rec, nodes = status_of(
        reply("running"),
        reply("failed", [(1, 3, 90.0, None, 9)], exit_code=1),
        None)
    nodes = nodes[:2] + (NodeStatus(2, "10.0.0.3", 2, 4, error=ConnectError(
        "no answer from 10.0.0.3:22 within 10s", host="10.0.0.3", kind="timeout")),)
    out = io.StringIO()
    print_plain(RunStatus(rec, nodes), out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "run 20250101-120000-ab12: running"
    assert "train.py --lr 0.1" in lines[1] and "FLAGS_START_PORT=17000" in lines[1]
    assert lines[2].split() == ["node", "host", "state", "ranks", "procs", "uptime", "exit",
                                "detail"]
    assert lines[3].split()[:4] == ["0", "10.0.0.1", "running", "0-1"]
    assert lines[4].split()[:4] == ["1", "10.0.0.2", "failed", "2-3"]
    assert lines[4].endswith("rank 3: killed by SIGKILL (out of memory? look for the OOM "
                             "killer in `dmesg` on that host)")
    assert lines[5].split()[:4] == ["2", "10.0.0.3", "unreachable", "4-5"]
    assert lines[5].endswith("no answer from 10.0.0.3:22 within 10s")
