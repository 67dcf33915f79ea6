"""The host side of a run, with real processes on this machine (the local transport runs
the same helper operations that ssh would): prepare, the detached supervisor, per-rank
records, stop with grandchildren, the host lock. No ssh and no torch: about 1 s each."""
from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from multihost import helper
from multihost.run import launchers as launch
from multihost.errors import RemoteError
from multihost.hosts import Host
from multihost.job import JobOptions
from multihost.run.plan import Prepared, build_plan, launch_request
from multihost.run.records import new_run_id
from multihost.transport import LocalTransport

SCRIPT = textwrap.dedent("""\
    import os, signal, subprocess, sys, time
    rank = int(os.environ["RANK"])
    if "--child" in sys.argv:   # a grandchild that ignores SIGTERM, in its own session
        subprocess.Popen([sys.executable, "-c", "import signal, time; "
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
                         start_new_session=True)
    print("rank", rank, "of", os.environ["WORLD_SIZE"], "local", os.environ["LOCAL_RANK"],
          "master", os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if "--token" in sys.argv:
        print("token", "ok" if os.environ.get("HF_TOKEN") == "hf_supersecret1" else "missing")
    if "--fail" in sys.argv and rank == 1:
        time.sleep(0.3)
        sys.exit(3)
    time.sleep(float(os.environ.get("SLEEP", "600")))
""")


STARTED = []   # every run a test started: stopped when the test ends, whatever happened


@pytest.fixture
def host(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "job.py").write_text(SCRIPT)
    transport = LocalTransport(Host("127.0.0.1", rank=0, python=sys.executable,
                                    workdir=str(tmp_path / "work")))
    yield transport
    while STARTED:
        run_id = STARTED.pop()
        helper.call(transport, "run.stop", {"run_id": run_id, "grace": 0})
        assert marked(run_id) == [], f"run {run_id} left processes behind"


def start(transport, args=(), nproc=2, template="python", env=None, allow_concurrent=False,
          grace=1.0, command=None):
    """prepare + launch through the real controller code; returns (run_id, run_dir).
    ``command`` runs as is (--no-python) instead of ``python job.py ARGS``."""
    run_id = new_run_id()
    plan = build_plan(run_id, [transport.host], JobOptions(nproc_per_node=nproc),
                      launch.load_template(template), command or ["job.py", *args],
                      start_port=17000, addresses=["127.0.0.1"], user_env=env or {},
                      kill_wait=grace, allow_concurrent=allow_concurrent,
                      no_python=command is not None)
    reply = helper.call(transport, "run.prepare", {
        "run_id": run_id, "node_rank": 0, "cwd": transport.host.workdir,
        "allow_concurrent": allow_concurrent})
    STARTED.append(run_id)
    prepared = Prepared.from_reply(reply)
    request = launch_request(plan, plan.nodes[0], prepared)
    helper.call(transport, "run.launch", {"run_id": run_id}, input=json.dumps(request).encode())
    return run_id, Path(prepared.run_dir)


def status(transport, run_id, tail=0):
    return helper.call(transport, "run.status", {"run_id": run_id, "tail": tail})


def wait_state(transport, run_id, states, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        reply = status(transport, run_id, tail=5)
        if reply["state"] in states:
            return reply
        assert time.monotonic() < deadline, reply
        time.sleep(0.1)


def marked(run_id):
    """Pids of live processes carrying the run's marker (what a stop must leave: none)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue
        if f"MULTIHOST_RUN_ID={run_id}".encode() in env and state != "Z":
            found.append(int(pid))
    return found


def test_ranks_get_torch_variables_their_own_logs_and_exit_records(host):
    run_id, run_dir = start(host, nproc=3, env={"SLEEP": "0"})
    reply = wait_state(host, run_id, {"succeeded"})
    assert [(r["local_rank"], r["rank"], r["exit_code"]) for r in reply["ranks"]] == \
        [(0, 0, 0), (1, 1, 0), (2, 2, 0)]
    log = (run_dir / "log" / "workerlog.2").read_text()
    assert "rank 2 of 3 local 2 master 127.0.0.1 17000" in log and "to stderr" in log
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["nproc"] == 3 and "SLEEP" in spec["display"]["env"]
    assert oct((run_dir).stat().st_mode & 0o777) == "0o700"


def test_ranks_that_exit_at_once_succeed_with_every_exit_recorded(host):
    # Issue 11: `run --launcher python --no-python -- echo hello` crashed the supervisor
    # (the ranks were gone before it looked up their process group).
    for _ in range(3):
        run_id, run_dir = start(host, nproc=4, command=["echo", "hello"])
        reply = wait_state(host, run_id, {"succeeded", "failed"})
        assert reply["state"] == "succeeded", reply
        assert [(r["local_rank"], r["exit_code"]) for r in reply["ranks"]] == \
            [(0, 0), (1, 0), (2, 0), (3, 0)]
        assert reply["node"]["pgid"] == reply["node"]["pid"]
        for local in range(4):
            assert (run_dir / "log" / f"workerlog.{local}").read_text() == "hello\n"


def test_run_state_on_a_host_is_private_to_the_user(host):
    run_id, run_dir = start(host, nproc=2, env={"SLEEP": "0"})
    wait_state(host, run_id, {"succeeded"})
    home = Path(os.environ["HOME"])
    modes = {str(p.relative_to(home)): oct(p.stat().st_mode & 0o777)
             for p in [home / ".multihost", home / ".multihost" / "runs", run_dir,
                       run_dir / "log", *run_dir.rglob("*")] if not p.is_symlink()}
    assert {p: m for p, m in modes.items() if m not in ("0o700", "0o600")} == {}


def test_secrets_reach_the_job_but_no_record(host):
    run_id, run_dir = start(host, args=["--token"], nproc=1,
                            env={"SLEEP": "0", "HF_TOKEN": "hf_supersecret1"})
    wait_state(host, run_id, {"succeeded"})
    assert "token ok" in (run_dir / "log" / "workerlog.0").read_text()
    for path in run_dir.glob("*.json"):
        assert "hf_supersecret1" not in path.read_text(), path
    assert json.loads((run_dir / "spec.json").read_text())["display"]["env"]["HF_TOKEN"] == "***"


def test_the_supervisor_is_detached_in_its_own_session(host):
    run_id, run_dir = start(host)
    node = wait_state(host, run_id, {"running"})["node"]
    supervisor = node["supervisor"]["pid"]
    assert os.getsid(supervisor) != os.getsid(0)
    assert os.getpgid(node["pgid"]) == node["pgid"] != os.getpgid(0)
    helper.call(host, "run.stop", {"run_id": run_id, "grace": 0})


def test_a_failed_rank_ends_its_local_peers_and_names_itself(host):
    run_id, _ = start(host, args=["--fail"], nproc=3)
    reply = wait_state(host, run_id, {"failed"})
    by_rank = {r["local_rank"]: r for r in reply["ranks"]}
    assert by_rank[1]["exit_code"] == 3
    assert by_rank[1]["exiting"] <= by_rank[1]["ended"]   # when sys.exit reached the top
    assert {by_rank[0]["signal"], by_rank[2]["signal"]} == {signal.SIGTERM}
    assert reply["tails"]["1"][0].startswith("rank 1 of 3")
    assert marked(run_id) == []


def test_stop_kills_grandchildren_that_ignore_sigterm_after_the_grace(host):
    run_id, _ = start(host, args=["--child"], grace=5.0)
    deadline = time.monotonic() + 10
    while len(marked(run_id)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(marked(run_id)) == 4        # 2 ranks + 2 grandchildren in their own sessions
    began = time.monotonic()
    reply = helper.call(host, "run.stop", {"run_id": run_id, "grace": 0.5, "reason": "test"})
    took = time.monotonic() - began
    assert reply["state"] == "stopped" and reply["node"]["stop_reason"] == "test"
    assert marked(run_id) == []
    assert took >= 0.5                      # the grace asked for was given, no more is asserted
    # Stopping again is harmless.
    assert helper.call(host, "run.stop", {"run_id": run_id, "grace": 0})["state"] == "stopped"


def test_one_run_per_host_stale_locks_are_taken_over(host):
    first, _ = start(host)
    with pytest.raises(RemoteError) as err:
        start(host)
    assert err.value.cause.startswith("busy: ") and f"run {first} (since" in err.value.cause
    assert f"multihost stop {first}" in err.value.fix
    other, _ = start(host, allow_concurrent=True)        # allowed beside it
    supervisor = wait_state(host, first, {"running"})["node"]["supervisor"]["pid"]
    os.kill(supervisor, signal.SIGKILL)                   # the first run's supervisor dies
    time.sleep(0.2)
    assert status(host, first)["state"] == "failed"       # seen as such
    # The run beside it holds the host too (every user sees it): stopped first.
    helper.call(host, "run.stop", {"run_id": other, "grace": 0})
    third, _ = start(host)                                # its lock was stale: taken over
    for run_id in (first, other, third):
        helper.call(host, "run.stop", {"run_id": run_id, "grace": 0})
        assert marked(run_id) == []                       # first: found by its marker alone


def test_stopping_one_run_leaves_another_alone(host):
    one, _ = start(host, allow_concurrent=True)
    two, _ = start(host, allow_concurrent=True)
    wait_state(host, two, {"running"})
    helper.call(host, "run.stop", {"run_id": one, "grace": 0})
    assert marked(one) == [] and len(marked(two)) == 2
    helper.call(host, "run.stop", {"run_id": two, "grace": 0})
    assert marked(two) == []


def test_a_launcher_that_cannot_start_is_a_clear_error_and_frees_the_host(host):
    broken = LocalTransport(Host("127.0.0.1", python="/nonexistent/python3",
                                 workdir=host.host.workdir))
    # The helper itself runs with a real python; only the job's interpreter is wrong.
    run_id = new_run_id()
    STARTED.append(run_id)
    plan = build_plan(run_id, [broken.host], JobOptions(), launch.load_template("torchrun"),
                      ["job.py"], start_port=17000, addresses=["127.0.0.1"])
    prepared = Prepared.from_reply(helper.call(host, "run.prepare", {
        "run_id": run_id, "node_rank": 0, "cwd": host.host.workdir}))
    request = launch_request(plan, plan.nodes[0], prepared)
    with pytest.raises(RemoteError) as err:
        helper.call(host, "run.launch", {"run_id": run_id}, input=json.dumps(request).encode())
    assert "cannot start /nonexistent/python3: No such file or directory" in err.value.cause
    assert "--python" in err.value.fix
    assert status(host, run_id)["state"] == "failed"
    start(host)    # the lock was released


def test_a_supervisor_crash_points_at_a_log_that_exists_and_frees_the_host(host):
    run_id = new_run_id()
    STARTED.append(run_id)
    plan = build_plan(run_id, [host.host], JobOptions(), launch.load_template("python"),
                      ["job.py"], start_port=17000, addresses=["127.0.0.1"])
    prepared = Prepared.from_reply(helper.call(host, "run.prepare", {
        "run_id": run_id, "node_rank": 0, "cwd": host.host.workdir}))
    request = dict(launch_request(plan, plan.nodes[0], prepared), nproc="many")  # a bug
    with pytest.raises(RemoteError) as err:
        helper.call(host, "run.launch", {"run_id": run_id}, input=json.dumps(request).encode())
    assert err.value.cause.startswith("supervisor crashed: ValueError")
    log = Path(prepared.run_dir) / "supervisor.log"
    assert f"read {log} on this host" in err.value.fix
    assert "Traceback" in log.read_text() and "many" in log.read_text()
    assert status(host, run_id)["state"] == "failed"
    start(host)    # the lock was released


def test_one_machine_prepared_twice_for_a_run_is_named_as_listed_twice(host):
    # localhost and 127.0.0.1 (or two addresses of one host) in one hostfile.
    run_id = new_run_id()
    STARTED.append(run_id)
    request = {"run_id": run_id, "node_rank": 0, "cwd": host.host.workdir}
    helper.call(host, "run.prepare", request)
    with pytest.raises(RemoteError) as err:
        helper.call(host, "run.prepare", dict(request, node_rank=1))
    assert "the machine is listed twice" in err.value.cause
    assert "list each machine once" in err.value.fix
    assert status(host, run_id)["node"]["node_rank"] == 0   # the first entry's, untouched


def test_prepare_refuses_a_missing_workdir_before_anything_starts(host, tmp_path):
    with pytest.raises(RemoteError) as err:
        helper.call(host, "run.prepare", {"run_id": new_run_id(), "node_rank": 0,
                                          "cwd": str(tmp_path / "nowhere")})
    assert "does not exist" in err.value.cause and "--no-sync" in err.value.fix
    with pytest.raises(RemoteError, match="no run"):
        status(host, "20250101-000000-0000")


def test_the_rank_wrapper_records_signals_and_dies_the_same_way(host, tmp_path):
    import subprocess

    run_dir = tmp_path / "rw"
    (run_dir / "log").mkdir(parents=True)
    wrapper = Path(launch.__file__).parent.parent / "remote" / "run" / "rankwrap.py"
    env = dict(os.environ, LOCAL_RANK="1", RANK="5")
    done = subprocess.run([sys.executable, "-S", str(wrapper), str(run_dir), sys.executable,
                           "-c", "import os, signal; print('hi'); os.kill(os.getpid(), 9)"],
                          env=env, timeout=30)
    assert done.returncode == -signal.SIGKILL
    record = json.loads((run_dir / "rank.1.json").read_text())
    assert (record["rank"], record["signal"], record["exit_code"]) == (5, 9, None)
    assert (run_dir / "log" / "workerlog.1").read_text() == "hi\n"
    done = subprocess.run([sys.executable, "-S", str(wrapper), str(run_dir), "/no/such/cmd"],
                          env=env, timeout=30)
    assert done.returncode == 127
    assert "cannot run /no/such/cmd" in (run_dir / "log" / "workerlog.1").read_text()


def test_a_rank_is_judged_by_when_its_script_began_to_exit_not_by_its_slow_atexit(tmp_path):
    """paddle closes its process groups' connections in an atexit handler, and the
    rank's peers abort on them while the rest of its teardown runs: the rank that exited
    first must still be the root cause."""
    import shutil
    import subprocess

    from multihost.run.outcome import failures_of, parse_status, root_cause

    run_dir = tmp_path / "rw"
    (run_dir / "log").mkdir(parents=True)
    (run_dir / "stackhook").mkdir()
    remote = Path(launch.__file__).parent.parent / "remote"
    shutil.copy(remote / "run" / "stackhook.py", run_dir / "stackhook" / "sitecustomize.py")
    script = "import atexit, sys, time; atexit.register(time.sleep, 1.5); sys.exit(3)"
    done = subprocess.run([sys.executable, "-S", str(remote / "run" / "rankwrap.py"), str(run_dir),
                           sys.executable, "-c", script],
                          env=dict(os.environ, LOCAL_RANK="1", RANK="3"), timeout=30)
    assert done.returncode == 3
    record = json.loads((run_dir / "rank.1.json").read_text())
    assert record["ended"] - record["exiting"] >= 1.4
    aborted = {"local_rank": 0, "rank": 0, "ended": record["exiting"] + 0.5, "signal": 6}
    failures = failures_of(1, "h2", parse_status({"state": "failed", "ranks": [record]}), 0)
    failures += failures_of(0, "h1", parse_status({"state": "failed", "ranks": [aborted]}), 0)
    assert root_cause(failures).rank == 3


def test_a_stop_sent_on_the_watch_stream_stops_the_run_and_the_stream_reports_it(host):
    """What the monitor does in a teardown: no `run.stop` session per host, one line on
    the watch stream it already has; the grandchildren that ignore SIGTERM die too."""
    run_id, _ = start(host, args=["--child"], grace=5.0)
    deadline = time.monotonic() + 10
    while len(marked(run_id)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    stream = helper.start(host, "run.watch", {"run_id": run_id, "interval": 0.1,
                                              "heartbeat": 0.5, "stoppable": True})
    try:
        stream.stdin.write(b'not json\n{"stop": {"grace": 0.5, "reason": "test"}}\n')
        stream.stdin.flush()
        last, deadline = {}, time.monotonic() + 20
        while not last.get("final") and time.monotonic() < deadline:
            line = stream.stdout.readline()   # a heartbeat every 0.5 s
            assert line, "the watch stream ended before the node did"
            last = json.loads(line)
    finally:
        stream.close()
    assert last.get("final"), "the run is still running: the stop line was not acted on"
    assert last["state"] == "stopped" and last["node"]["stop_reason"] == "test"
    assert marked(run_id) == []


def prepared_held(transport):
    """A prepared run and its launch started held (as a run's launch is, beside the
    prepare): (run_id, the launch's spec line, the held call)."""
    run_id = new_run_id()
    plan = build_plan(run_id, [transport.host], JobOptions(nproc_per_node=1),
                      launch.load_template("python"), ["job.py"], start_port=17000,
                      addresses=["127.0.0.1"], kill_wait=1.0)
    held = helper.HeldCall(transport, "run.launch", {"run_id": run_id})
    reply = helper.call(transport, "run.prepare", {
        "run_id": run_id, "node_rank": 0, "cwd": transport.host.workdir})
    STARTED.append(run_id)
    request = launch_request(plan, plan.nodes[0], Prepared.from_reply(reply))
    return run_id, json.dumps(request).encode(), held


def test_a_launch_started_beside_the_prepare_runs_the_node_once_told_go(host, monkeypatch):
    monkeypatch.setenv("SLEEP", "600")
    run_id, spec, held = prepared_held(host)
    held.release(spec, go=True)
    assert held.reply(timeout=30)["state"] == "running"
    assert wait_state(host, run_id, {"running"})["supervisor_alive"]


def test_a_launch_never_told_go_starts_nothing_and_says_so(host):
    run_id, spec, held = prepared_held(host)
    held.release(spec, go=False)
    with pytest.raises(RemoteError, match="not launched: the launch stopped before"):
        held.reply(timeout=30)
    reply = status(host, run_id)
    assert reply["node"]["state"] == "prepared" and not reply["supervisor_alive"]
    assert marked(run_id) == []


def test_a_cancelled_launch_starts_nothing(host):
    run_id, _, held = prepared_held(host)
    held.cancel()
    held.process.wait(30)   # it ended by itself, having read no "go"
    reply = status(host, run_id)
    assert reply["node"]["state"] == "prepared" and not reply["supervisor_alive"]
