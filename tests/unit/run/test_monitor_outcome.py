"""How a run's end is judged: exit statuses decoded, failures found in recorded status
replies, the root cause (earliest failure by time), and the run's own exit status."""
from __future__ import annotations

import dataclasses
import signal

import pytest

from multihost.events import RunState
from multihost.run.exits import decode_exit, exit_status
from multihost.run.outcome import (Failure, conclude, describe, failures_of, parse_status,
                                   root_cause, run_status, status_of_node_records, to_event)

# What `run.status` answered for a torchrun node whose local rank 1 exited 3, recorded
# in the lab (trimmed): the launcher itself was ended by the teardown's SIGTERM.
FAILED_NODE = {
    "node": {"run_id": "20261121-220258-7713", "node_rank": 1, "state": "failed",
             "exit_code": None, "signal": 15, "pid": 18415, "pgid": 18415,
             "started": 1795298579.08, "ended": 1795298584.42,
             "supervisor": {"pid": 18414, "ticks": 90720}},
    "state": "failed", "detail": "", "supervisor_alive": False, "procs": 0,
    "time": 1795298586.3,
    "ranks": [
        {"local_rank": 0, "rank": 2, "pid": 18649, "started": 1795298582.38,
         "ended": 1795298583.76, "exit_code": None, "signal": 15},
        {"local_rank": 1, "rank": 3, "pid": 18648, "started": 1795298582.36,
         "ended": 1795298583.67, "exit_code": 3, "signal": None}],
    "tails": {"1": ["rank 3 fails now"]}, "launcher_tail": ["ChildFailedError"],
}
# A node stopped by the teardown: its ranks died of SIGTERM after the failure elsewhere.
STOPPED_NODE = {
    "node": {"state": "stopped", "exit_code": 1, "signal": None, "ended": 1795298585.1},
    "state": "stopped", "detail": "teardown: h2 (node 1) failed", "procs": 0,
    "ranks": [{"local_rank": 0, "rank": 0, "ended": 1795298584.9, "exit_code": None,
               "signal": 15}],
}


@pytest.mark.parametrize("code, sig, text", [
    (0, None, "exit 0"),
    (3, None, "exit 3"),
    (None, signal.SIGKILL, "killed by SIGKILL (out of memory? look for the OOM killer in "
                           "`dmesg` on that host)"),
    (137, None, "exit 137 (killed by SIGKILL; out of memory? look for the OOM killer in "
                "`dmesg` on that host)"),
    (-11, None, "killed by SIGSEGV (segmentation fault)"),
    (143, None, "exit 143 (killed by SIGTERM)"),
    (None, signal.SIGTERM, "killed by SIGTERM"),
    (255, None, "exit 255"),
    (None, None, "ended without an exit status"),
])
def test_exit_statuses_are_decoded(code, sig, text):
    assert decode_exit(code, sig) == text


def test_on_a_node_multihost_stopped_its_own_signals_are_named_as_its_own():
    """After `stop` (or Ctrl-C), a rank that ignored SIGTERM was SIGKILLed by multihost:
    no hint at the OOM killer, which would send the user looking in the wrong place."""
    killed = "killed by SIGKILL (multihost killed it after the --kill-wait grace: it ignored SIGTERM)"
    assert decode_exit(None, signal.SIGKILL, stopped=True) == killed
    assert decode_exit(137, None, stopped=True) == \
        "exit 137 (killed by SIGKILL; multihost killed it after the --kill-wait grace: it " \
        "ignored SIGTERM)"
    assert decode_exit(-15, None, stopped=True) == "killed by SIGTERM (stopped by multihost)"
    assert decode_exit(None, signal.SIGSEGV, stopped=True) == "killed by SIGSEGV (segmentation fault)"


@pytest.mark.parametrize("code, sig, status", [
    (3, None, 3), (None, 9, 137), (-15, None, 143), (0, None, 1), (256, None, 1), (1, None, 1)])
def test_exit_status_as_a_shell_reports_it(code, sig, status):
    assert exit_status(code, sig) == status


def test_a_recorded_reply_parses_into_ranks_and_tails():
    view = parse_status(FAILED_NODE)
    assert view.state == "failed" and view.finished and view.signal == 15
    assert [(r.rank, r.failed) for r in view.ranks] == [(2, True), (3, True)]
    assert view.tails == {1: ("rank 3 fails now",)}


def test_the_root_cause_is_the_earliest_failure_not_the_follow_on_errors():
    failures = failures_of(1, "h2", parse_status(FAILED_NODE), now=0)
    failures += failures_of(0, "h1", parse_status(STOPPED_NODE), now=0)
    cause = root_cause(failures)
    assert (cause.host, cause.rank, cause.local_rank, cause.exit_code) == ("h2", 3, 1, 3)
    assert describe(cause) == "node 1, rank 3 (local rank 1): exit 3"
    event = to_event(cause, ["rank 3 fails now"])
    assert (event.exit_code, event.reason, event.tail) == (3, "exit 3", ("rank 3 fails now",))


def test_a_node_that_failed_without_a_failed_rank_is_its_own_failure():
    reply = {"state": "failed", "detail": "cannot start python3.13: No such file",
             "node": {"state": "failed", "exit_code": 2, "ended": 10.0}, "ranks": []}
    (failure,) = failures_of(2, "h3", parse_status(reply), now=99)
    assert (failure.kind, failure.time, failure.status) == ("node", 10.0, 2)
    assert failure.reason == "exit 2: cannot start python3.13: No such file"


def test_same_time_prefers_the_rank_and_lost_hosts_exit_255():
    at = 5.0
    rank = Failure(at, 1, "h2", "rank", rank=3, local_rank=1, exit_code=1)
    node = Failure(at, 0, "h1", "node", exit_code=1)
    lost = Failure(4.0, 2, "h3", "lost", detail="host lost: no answer for 15s")
    assert root_cause([node, rank]) is rank
    assert root_cause([node, rank, lost]) is lost and lost.status == 255
    assert lost.reason == "host lost: no answer for 15s"
    assert root_cause([]) is None


def test_run_status():
    cause = Failure(1.0, 0, "h1", "rank", rank=0, local_rank=0, signal=signal.SIGKILL)
    assert run_status(["succeeded", "succeeded"], None, False) == 0
    assert run_status(["failed", "stopped"], cause, False) == 137
    assert run_status(["stopped", "stopped"], None, True) == 130
    assert run_status(["stopped", "succeeded"], None, False) == 143
    assert run_status(["stopped", "stopped"], cause, True) == 137   # a failure beats Ctrl-C


# The launchers' own words when a rank fails, recorded in the lab.
PADDLE_TAIL = [
    "LAUNCH WARNING 2026-11-21 22:17:29,502 master is set by args, it will be overwritten by "
    "198.18.0.11:17000.",
    "LAUNCH ERROR 2026-11-21 22:17:32,548 Container failed !!!",
    "Container rank 1 status failed cmd ['/opt/py/bin/python', '-u', 'ranks.py', "
    "'--fail-rank', '3', '--after', '2'] code 3 log /root/.multihost/runs/x/log/workerlog.1",
]
TORCHRUN_TAIL = [
    "Failures:", "[1]:", "  time      : 2026-11-21_22:03:03", "  host      : localhost",
    "  rank      : 0 (local_rank: 0)", "  exitcode  : -15 (pid: 18639)  (SIGTERM)",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-21_22:03:03",
    "  host      : localhost", "  rank      : 1 (local_rank: 1)",
    "  exitcode  : 3 (pid: 18640) ", "  error_file: <N/A>",
]


def test_launchers_name_the_failed_rank_in_their_output():
    from multihost.run.exits import launcher_failure

    assert launcher_failure(PADDLE_TAIL) == (1, 3)
    assert launcher_failure(TORCHRUN_TAIL) == (1, 3)
    assert launcher_failure(["Traceback (most recent call last):", "ValueError"]) is None


def test_a_node_failure_is_refined_to_the_rank_its_launcher_named():
    from multihost.run.outcome import refine

    node = Failure(10.0, 1, "h2", "node", exit_code=241)
    rank = refine(node, PADDLE_TAIL, rank_offset=2)
    assert (rank.kind, rank.rank, rank.local_rank, rank.exit_code) == ("rank", 3, 1, 3)
    killed = refine(node, ["Container rank 0 status failed cmd [] code -9 log x"], 2)
    assert (killed.rank, killed.signal, killed.status) == (2, 9, 137)
    assert refine(node, ["nothing useful"], 2) is node


def test_one_place_decides_a_runs_final_state_exit_status_and_root_cause():
    rank = Failure(10.0, 1, "h2", "rank", rank=3, local_rank=1, exit_code=3)
    failed = conclude(["stopped", "failed"], rank, False, ("boom",))
    assert (failed.state, failed.exit_code) == (RunState.FAILED, 3)
    assert (failed.root_cause.host, failed.root_cause.rank, failed.root_cause.local_rank,
            failed.root_cause.tail) == ("h2", 3, 1, ("boom",))
    assert conclude(["succeeded", "succeeded"], None, False) == (
        conclude(["succeeded"], None, False))
    assert conclude(["succeeded"], None, False).state is RunState.SUCCEEDED
    assert (conclude(["succeeded"], None, True).state, conclude(["succeeded"], None, True).exit_code) \
        == (RunState.STOPPED, 130)
    assert conclude(["stopped", "succeeded"], None, False).exit_code == 143


def test_the_exit_status_from_node_records_alone():
    """`logs --follow` with no run.status answer: the nodes' last records decide."""
    assert status_of_node_records([{"state": "succeeded"}, None]) == 0
    assert status_of_node_records([{"state": "succeeded"}, {"state": "failed", "exit_code": 7}]) == 7
    assert status_of_node_records([{"state": "failed", "exit_code": 300}]) == 1
    assert status_of_node_records([None]) == 1


def test_a_parameter_server_node_that_says_when_its_trainers_ended_is_serving():
    from multihost.run.outcome import parse_status

    assert parse_status({"node": {"state": "running", "serving": 1795384767.2}}).serving
    assert not parse_status({"node": {"state": "running"}}).serving
    assert not parse_status({"node": {"state": "running", "serving": "yes"}}).serving


# paddle's launcher, 2 lab hosts x 2 trainers, global rank 3 exits 3 (recorded in the lab,
# trimmed): each trainer's end as the rank wrapper recorded it. Within 43 ms of rank 3's
# exit, its gloo peers abort (rank 0 on the other host, rank 2 beside it), and paddle's
# own launcher names the local rank that aborted; the records name the rank that ended first.
PADDLE_EXIT_3 = [
    {"node": {"state": "failed", "exit_code": 15, "ended": 1795792803.99,
              "stop_reason": "teardown: 198.18.0.12 (node 1) failed"},
     "state": "failed", "detail": "",
     "ranks": [{"local_rank": 0, "rank": 0, "pid": 384, "started": 1795792791.78,
                "ended": 1795792802.5047, "exit_code": None, "signal": 6},
               {"local_rank": 1, "rank": 1, "pid": 385, "started": 1795792791.85,
                "ended": 1795792802.6318, "exit_code": None, "signal": 15}]},
    {"node": {"state": "failed", "exit_code": 15, "ended": 1795792804.0},
     "state": "failed", "detail": "",
     "ranks": [{"local_rank": 0, "rank": 2, "pid": 378, "started": 1795792791.90,
                "ended": 1795792802.5752, "exit_code": None, "signal": 6},
               {"local_rank": 1, "rank": 3, "pid": 379, "started": 1795792791.91,
                "ended": 1795792802.4617, "exit_code": 3, "signal": None}]},
]
# `multihost fleetrun`, servers on both hosts, trainers 0-1 and 2-3: parameter server 1
# (the second host's) killed with `kill -9`. Its host's supervisor recorded it with its
# last lines and stopped the trainers there; the first host was stopped by multihost.
PS_SERVER_KILLED = [
    {"node": {"state": "stopped", "signal": 15, "ended": 1795792822.26,
              "servers": [{"local_rank": 0, "rank": 0, "pid": 430, "log": "serverlog.0",
                           "started": 1795792806.03, "ended": 1795792822.2578,
                           "exit_code": None, "signal": 15}]},
     "state": "stopped", "detail": "teardown: 198.18.0.12 (node 1) failed",
     "ranks": [{"local_rank": 0, "rank": 0, "ended": 1795792822.1517, "signal": 15},
               {"local_rank": 1, "rank": 1, "ended": 1795792822.0328, "signal": 15}]},
    {"node": {"state": "failed", "signal": 9, "ended": 1795792822.16,
              "stop_reason": "server 1 exited (signal 9) while trainers ran",
              "servers": [{"local_rank": 0, "rank": 1, "pid": 423, "log": "serverlog.0",
                           "started": 1795792806.26, "ended": 1795792821.8498,
                           "exit_code": None, "signal": 9}],
              "server_failed": {"local_rank": 0, "rank": 1, "pid": 423, "log": "serverlog.0",
                                "started": 1795792806.26, "ended": 1795792821.8498,
                                "exit_code": None, "signal": 9,
                                "tail": ["I1127 15:20:15.195024 423 brpc_ps_server.cc:78] "
                                         "running server with rank id: 1, endpoint: "
                                         "198.18.0.12:17580"]}},
     "state": "failed", "detail": "",
     "ranks": [{"local_rank": 0, "rank": 2, "ended": 1795792822.1603, "signal": 15},
               {"local_rank": 1, "rank": 3, "ended": 1795792822.1617, "signal": 15}]},
]
HOSTS = ("198.18.0.11", "198.18.0.12")


def judged(replies):
    """What the controller concludes from the hosts' last answers (a stopped node's
    ranks died of the stop: no failures of its own)."""
    nodes = [(i, HOSTS[i], parse_status(reply)) for i, reply in enumerate(replies)]
    failures = [f for i, host, view in nodes if view.state != "stopped"
                for f in failures_of(i, host, view, now=0)]
    cause = root_cause(failures)
    return cause, conclude([v.state for _, _, v in nodes], cause, False, (), nodes)


def test_under_paddles_launcher_the_rank_that_ended_first_is_named_and_its_peers_after_it():
    cause, end = judged(PADDLE_EXIT_3)
    assert describe(cause) == "node 1, rank 3 (local rank 1): exit 3"
    assert end.exit_code == 3 and end.root_cause.rank == 3
    assert end.root_cause.after == (
        "198.18.0.11 (node 0) rank 0: killed by SIGABRT (aborted), stopped after rank 3 failed",
        "198.18.0.11 (node 0) rank 1: killed by SIGTERM, stopped after rank 3 failed",
        "198.18.0.12 (node 1) rank 2: killed by SIGABRT (aborted), stopped after rank 3 failed")


def test_a_parameter_server_that_died_first_is_the_root_cause_with_its_last_lines():
    cause, end = judged(PS_SERVER_KILLED)
    assert (cause.kind, cause.server, cause.rank, cause.signal) == ("server", 1, None, 9)
    assert describe(cause).startswith("node 1: parameter server 1 killed by SIGKILL")
    assert end.exit_code == 137 and end.root_cause.rank is None
    assert list(end.root_cause.tail) == PS_SERVER_KILLED[1]["node"]["server_failed"]["tail"]
    assert end.root_cause.after == (
        "198.18.0.11 (node 0) ranks 0, 1: killed by SIGTERM (stopped by multihost), "
        "stopped after parameter server 1 failed",
        "198.18.0.11 (node 0) parameter server 0: killed by SIGTERM (stopped by multihost), "
        "stopped after parameter server 1 failed",
        "198.18.0.12 (node 1) ranks 2, 3: killed by SIGTERM, stopped after parameter server 1 "
        "failed")


def test_a_run_stopped_for_hanging_names_no_rank_as_stopped_after_another():
    hang = Failure(5.0, 0, "h1", "hang", detail="no step for 600s")
    nodes = [(1, "h2", parse_status(PADDLE_EXIT_3[1]))]
    assert conclude(["stopped"], hang, False, (), nodes).root_cause.after == ()


def test_many_hosts_stopped_after_a_failure_are_counted_past_a_few_lines():
    cause = Failure(1.0, 0, "h0", "rank", rank=0, local_rank=0, exit_code=3)
    stopped = {"state": "stopped", "node": {"state": "stopped"},
               "ranks": [{"local_rank": 0, "rank": 0, "ended": 2.0, "signal": 15}]}
    nodes = [(i, f"h{i}", parse_status(stopped)) for i in range(1, 20)]
    after = conclude(["stopped"] * 19, cause, False, (), nodes).root_cause.after
    assert len(after) == 8
    assert after[-1] == "and 12 more on 12 more hosts, stopped after rank 0 failed"


def test_a_failed_parameter_server_points_at_its_own_log():
    from types import SimpleNamespace

    from multihost.run.request import fix_for

    plan = SimpleNamespace(run_id="20261127-152005-f588", nodes=[
        SimpleNamespace(host=SimpleNamespace(label=host)) for host in HOSTS])
    server = Failure(1.0, 1, HOSTS[1], "server", exit_code=1, server=1)
    assert fix_for(server, plan) == ("read its log: multihost logs 20261127-152005-f588 "
                                     "--host 198.18.0.12 --role server")


def test_a_failed_ranks_log_is_named_where_its_host_keeps_it():
    from types import SimpleNamespace

    from multihost.remote.run.states import NO_SPACE
    from multihost.run.request import fix_for

    plan = SimpleNamespace(run_id="20261127-152005-f588", nodes=[
        SimpleNamespace(host=SimpleNamespace(label=host)) for host in HOSTS])
    cause = Failure(1.0, 1, HOSTS[1], "rank", rank=3, local_rank=1, exit_code=1)
    # the second host of a shared home keeps its runs under hosts/<its name>/
    shared = {0: "/home/alice/.multihost/runs/20261127-152005-f588",
              1: "/home/alice/.multihost/hosts/h2-1a2b3c4d/runs/20261127-152005-f588"}
    assert fix_for(cause, plan, shared).endswith(
        "(on the host: /home/alice/.multihost/hosts/h2-1a2b3c4d/runs/20261127-152005-f588"
        "/log/workerlog.1)")
    full = Failure(1.0, 1, HOSTS[1], "node", detail=NO_SPACE)
    assert "`rm -rf /home/alice/.multihost/hosts/h2-1a2b3c4d/runs/<run id>`" in fix_for(
        full, plan, shared)
    assert fix_for(cause, plan).endswith(   # not known: the default place
        "(on the host: ~/.multihost/runs/20261127-152005-f588/log/workerlog.1)")


def test_paddles_gloo_group_set_up_failure_is_named_with_its_fix():
    from multihost.run.outcome import known_fix

    tail = ["  File \"train.py\", line 12, in <module>",
            "    fleet.init(is_collective=True)",
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:784] connect "
            "[198.18.0.11]:949: Connection refused"]
    fix = known_fix(tail)
    assert fix is not None and "--max-restarts 3" in fix and "not the network" in fix
    assert known_fix(["gloo/transport/tcp/pair.cc:784 connect [198.18.0.11]:949: "
                      "Connection refused"]) == fix
    assert known_fix(["ValueError: bad batch"]) is None


def test_lightnings_world_size_refusal_gets_the_flags_that_give_its_world_size():
    from types import SimpleNamespace

    from multihost.run.request import fix_for

    plan = SimpleNamespace(run_id="20261127-152005-f588", nodes=[
        SimpleNamespace(host=SimpleNamespace(label=host), nproc=1) for host in ("h1", "h2", "h3")])
    said = ("ValueError: You set `devices=2` and `num_nodes=3` in Lightning, but the product "
            "(2 * 3) does not match the world size (3).")
    cause = Failure(1.0, 0, "h1", "rank", rank=0, local_rank=0, exit_code=1,
                    tail=("Traceback (most recent call last):", said))
    assert fix_for(cause, plan) == (
        "Lightning asks devices=2 x num_nodes=3 = 6 processes; multihost started 3 hosts x 1 "
        "process = 3: give --nproc_per_node 2 (Lightning's devices, per host)")
    two_hosts = SimpleNamespace(run_id=plan.run_id, nodes=plan.nodes[:2])
    assert "give 3 hosts and --nproc_per_node 2, or set num_nodes=2" in fix_for(
        dataclasses.replace(cause, tail=(said.replace("(3)", "(2)"),)), two_hosts)
