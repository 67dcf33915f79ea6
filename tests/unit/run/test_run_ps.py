"""A parameter-server node, supervised by multihost (no paddle needed: the roles are
tiny scripts that read the variables paddle's launcher would give them)."""
import json
import sys
import time
from pathlib import Path

import pytest

from multihost import helper
from multihost.run import launchers as launch
from multihost.run.fleetrun import layout_per_machine
from multihost.hosts import Host
from multihost.job import JobOptions
from multihost.run.plan import Prepared, build_plan, launch_request
from multihost.run.records import new_run_id
from multihost.transport import LocalTransport

from test_launch_supervisor import marked, status, wait_state

# A server waits forever, as paddle's does; a trainer works a moment and exits, with
# the code it is told to (per trainer id; a failing one a little later than the others),
# or the server exits early when told to.
ROLE = """\
import os, sys, time
role, me = os.environ["TRAINING_ROLE"], os.environ.get("PADDLE_TRAINER_ID", "-")
print(role, me, os.environ["PADDLE_PSERVERS_IP_PORT_LIST"], os.environ["POD_IP"], flush=True)
if role == "PSERVER":
    time.sleep(float(os.environ.get("SERVER_LIFE", "600")))
    sys.exit(int(os.environ.get("SERVER_CODE", "0")))
code = int(os.environ.get("FAIL_" + me, "0"))
time.sleep(float(os.environ.get("TRAINER_LIFE", "0.3")) + (0.5 if code else 0))
sys.exit(code)
"""


@pytest.fixture
def node(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "role.py").write_text(ROLE)
    host = Host("127.0.0.1", python=sys.executable, workdir=str(work))
    started = []

    def start(env):
        run_id = new_run_id()
        layout = layout_per_machine(["127.0.0.1"], 1, 2, 17000)
        plan = build_plan(run_id, [host], JobOptions(), launch.load_template("paddle_ps"),
                          ["role.py"], start_port=17000, addresses=["127.0.0.1"], user_env=env,
                          kill_wait=1.0, ps=layout)
        transport = LocalTransport(host)
        reply = helper.call(transport, "run.prepare", {"run_id": run_id, "node_rank": 0,
                                                       "cwd": str(work)})
        prepared = Prepared.from_reply(reply)
        helper.call(transport, "run.launch", {"run_id": run_id},
                    input=json.dumps(launch_request(plan, plan.nodes[0], prepared)).encode())
        started.append((transport, run_id))
        return transport, run_id, Path(prepared.run_dir)

    yield start
    for transport, run_id in started:
        helper.call(transport, "run.stop", {"run_id": run_id, "grace": 0})
        assert marked(run_id) == []


def wait_serving(transport, run_id, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        reply = status(transport, run_id)
        if reply["node"].get("serving") or reply["state"] != "running":
            return reply
        assert time.monotonic() < deadline, reply
        time.sleep(0.1)


def test_trainers_done_leave_servers_serving_until_stopped_then_the_node_succeeded(node):
    transport, run_id, run_dir = node({})
    reply = wait_serving(transport, run_id)
    assert reply["state"] == "running" and reply["node"]["serving"]   # paddle's servers wait
    assert "PSERVER - 127.0.0.1:17000" in (run_dir / "log" / "serverlog.0").read_text()
    assert "TRAINER 1 " in (run_dir / "log" / "workerlog.1").read_text()
    done = helper.call(transport, "run.stop", {"run_id": run_id, "grace": 1,
                                               "reason": "every trainer finished"})
    assert done["state"] == "succeeded" and marked(run_id) == []


def test_a_failed_trainer_fails_the_node_and_stops_its_server(node):
    transport, run_id, _ = node({"FAIL_1": "3"})
    reply = wait_state(transport, run_id, {"failed", "succeeded", "stopped"})
    assert reply["state"] == "failed" and reply["node"]["exit_code"] == 3
    assert [(r["rank"], r["exit_code"]) for r in reply["ranks"]] == [(0, 0), (1, 3)]
    assert marked(run_id) == []


def test_a_server_that_exits_while_trainers_run_fails_the_node(node):
    transport, run_id, _ = node({"SERVER_LIFE": "0", "SERVER_CODE": "0", "FAIL_0": "0"})
    # the trainers sleep 0.3 s; the server is gone before that
    reply = wait_state(transport, run_id, {"failed", "succeeded", "stopped"})
    assert reply["state"] == "failed"
    assert "server 0 exited" in reply["node"]["stop_reason"]
    assert marked(run_id) == []


def test_a_server_killed_while_trainers_run_is_recorded_with_its_signal_and_last_lines(node):
    import os
    import signal

    from multihost.run.outcome import failures_of, parse_status, root_cause

    transport, run_id, run_dir = node({"TRAINER_LIFE": "30"})
    (server,) = wait_state(transport, run_id, {"running"})["node"]["servers"]
    deadline = time.monotonic() + 10
    while "PSERVER" not in (run_dir / "log" / "serverlog.0").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(server["pid"], signal.SIGKILL)
    reply = wait_state(transport, run_id, {"failed", "succeeded", "stopped"})
    assert (reply["state"], reply["node"]["signal"]) == ("failed", signal.SIGKILL)
    failed = reply["node"]["server_failed"]
    assert (failed["rank"], failed["signal"]) == (0, signal.SIGKILL)
    assert any(line.startswith("PSERVER - 127.0.0.1:17000") for line in failed["tail"])
    # its trainers were stopped for it, after it
    assert all(r["signal"] == signal.SIGTERM and r["ended"] > failed["ended"]
               for r in reply["ranks"])
    cause = root_cause(failures_of(0, "h1", parse_status(reply), now=0))
    assert (cause.kind, cause.server, cause.signal) == ("server", 0, signal.SIGKILL)
    assert marked(run_id) == []
