"""`multihost run`, `status` and `stop` end to end in the lab: real sshd, real torchrun.

The issue's acceptance list: ranks in ip order with one FLAGS_START_PORT and a correct
all_reduce; a failing rank ends the run on every host with no process left; Ctrl-C;
--detach then stop; a controller killed with SIGKILL leaves the job to status and stop;
a host lost mid-run; one run per host unless --allow-concurrent.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import cached_venv

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLES = REPO / "examples"

# Every process of a run carries MULTIHOST_RUN_ID; its supervisor has the id in argv.
SCAN = textwrap.dedent("""\
    import os, sys
    run_id = sys.argv[1]
    marker = ("MULTIHOST_RUN_ID=" + run_id).encode()
    me = {os.getpid(), os.getppid()}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in me:
            continue
        try:
            env = open("/proc/%s/environ" % pid, "rb").read().split(b"\\0")
            argv = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\\0", b" ")
        except OSError:
            continue
        if b" run.watch " in argv or b" run.status " in argv:
            continue  # multihost's own observer, ending as the controller hangs up
        if marker in env or run_id.encode() in argv:
            print(pid, argv.decode(errors="replace")[:120])
""")

# Ranks that stay up; each also starts a child that ignores SIGTERM in its own session
# (a data-loader worker gone astray): the teardown must find and SIGKILL it too.
SLEEPER = textwrap.dedent("""\
    import os, signal, socket, subprocess, sys, time
    rank = int(os.environ["RANK"])
    subprocess.Popen([sys.executable, "-c",
                      "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "time.sleep(600)"], start_new_session=True)
    print("up host=%s rank=%d" % (socket.gethostname(), rank), flush=True)
    fail_rank = int(sys.argv[1]) if len(sys.argv) > 1 else -1
    if rank == fail_rank:
        time.sleep(float(sys.argv[2]))
        print("rank %d fails now" % rank, flush=True)
        sys.exit(3)
    time.sleep(600)
""")


def hostfile(lab, tmp_path: Path, n: int) -> Path:
    """The lab's hostfile cut to its first n hosts."""
    kept, hosts = [], 0
    for line in lab.hostfile.read_text().splitlines():
        if line.startswith("[") and line != "[defaults]":
            hosts += 1
            if hosts > n:
                break
        kept.append(line)
    path = tmp_path / f"hosts{n}.ini"
    path.write_text("\n".join(kept) + "\n")
    return path


@pytest.fixture
def code(tmp_path: Path) -> Path:
    directory = tmp_path / "code"
    directory.mkdir()
    (directory / "sleeper.py").write_text(SLEEPER)
    return directory


def leftovers(lab, n: int, run_id: str) -> dict:
    """{host i: [process lines]} of every process of the run still alive, per host."""
    found = {}
    for i in range(1, n + 1):
        result = lab.host_run(i, [sys.executable, "-c", SCAN, run_id], check=True)
        if result.stdout.strip():
            found[i] = result.stdout.strip().splitlines()
    return found


def run_id_in(text: str) -> str:
    match = re.search(r"\b(\d{8}-\d{6}-[0-9a-f]{4})\b", text)
    assert match, f"no run id in:\n{text}"
    return match.group(1)


def status_json(lab, run_id: str) -> dict:
    result = lab.multihost("status", run_id, "--json", timeout=60)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def wait_running(lab, run_id: str, nodes: int, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = status_json(lab, run_id)
        states = [node["state"] for node in status["nodes"]]
        if states == ["running"] * nodes and all(n["procs"] for n in status["nodes"]):
            return status
        assert time.monotonic() < deadline, f"not running after {timeout}s: {status}"
        time.sleep(0.5)


def run_started_by(lab, proc, timeout: float = 60) -> str:
    """The id of the run that the controller process ``proc`` started (its record)."""
    deadline = time.monotonic() + timeout
    runs = lab.home / ".multihost" / "runs"
    while time.monotonic() < deadline:
        for record in sorted(runs.glob("*/run.json"), reverse=True) if runs.is_dir() else []:
            try:
                if json.loads(record.read_text())["controller"]["pid"] == proc.pid:
                    return record.parent.name
            except (OSError, ValueError, KeyError):
                continue
        assert proc.poll() is None, f"the controller exited: {proc.stderr.read() if proc.stderr else ''}"
        time.sleep(0.3)
    raise AssertionError("the run never started")


def test_ranks_in_ip_order_with_one_start_port_and_a_correct_all_reduce(lab, tmp_path):
    hosts = hostfile(lab, tmp_path, 3)
    result = lab.multihost("run", "--hostfile", str(hosts), "--nproc_per_node", "2",
                           "--code", str(EXAMPLES), "--log_dir", str(tmp_path / "log"),
                           "--plain", "--", "ranks.py", timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = {}
    for line in result.stdout.splitlines():
        match = re.search(r"host=(h\d) rank=(\d) local_rank=(\d) world_size=(\d) "
                          r"FLAGS_START_PORT=(\d+) node_rank=(\d)", line)
        if match:
            host, rank, local, world, port, node = match.groups()
            seen[int(rank)] = (host, int(local), int(world), port, int(node))
    assert sorted(seen) == [0, 1, 2, 3, 4, 5], result.stdout[-3000:]
    for rank, (host, local, world, port, node) in seen.items():
        assert host == f"h{rank // 2 + 1}"       # ranks 0-1 on h1, 2-3 on h2, 4-5 on h3
        assert (local, node, world) == (rank % 2, rank // 2, 6)
    assert len({port for _, _, _, port, _ in seen.values()}) == 1
    assert result.stdout.count("all_reduce sum=21 expected=21 ok") == 6
    run_id = run_id_in(result.stderr)
    status = status_json(lab, run_id)
    assert [n["state"] for n in status["nodes"]] == ["succeeded"] * 3
    assert status["state"] == "succeeded" and status["exit_code"] == 0


def test_a_failing_rank_ends_the_run_on_every_host_with_no_process_left(lab, tmp_path, code):
    hosts = hostfile(lab, tmp_path, 3)
    started = time.monotonic()
    result = lab.multihost("run", "--hostfile", str(hosts), "--nproc_per_node", "2",
                           "--code", str(code), "--no-check", "--kill-wait", "2", "--plain",
                           "--log_dir", str(tmp_path / "log"), "--", "sleeper.py", "3", "2",
                           timeout=120)
    took = time.monotonic() - started
    assert result.returncode == 3, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    # One line: the host, the rank, the decoded status, and a fix.
    assert last.startswith("multihost: 198.18.0.12: run ") and "rank 3 (local rank 1): exit 3" \
        in last and "(fix: " in last, last
    assert "rank 3 fails now" in result.stderr          # the root cause's last lines
    run_id = run_id_in(result.stderr)
    assert leftovers(lab, 3, run_id) == {}
    status = status_json(lab, run_id)
    assert [n["state"] for n in status["nodes"]] == ["stopped", "failed", "stopped"]
    assert status["root_cause"]["rank"] == 3
    assert took < 120          # generous: the 2 cores may be shared with other test runs


def test_ctrl_c_stops_the_run_on_every_host(lab, tmp_path, code):
    hosts = hostfile(lab, tmp_path, 2)
    proc = lab.popen([sys.executable, "-m", "multihost", "run", "--hostfile", str(hosts),
                      "--launcher", "python", "--nproc_per_node", "2", "--code", str(code),
                      "--no-check", "--kill-wait", "2", "--plain", "--log_dir",
                      str(tmp_path / "log"), "--", "sleeper.py"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True)
    try:
        run_id = run_started_by(lab, proc)
        wait_running(lab, run_id, 2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "stopped on every host (interrupted)" in err
    assert leftovers(lab, 2, run_id) == {}
    assert {n["state"] for n in status_json(lab, run_id)["nodes"]} == {"stopped"}


def test_detach_then_stop_from_another_shell(lab, tmp_path, code):
    hosts = hostfile(lab, tmp_path, 2)
    started = lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python",
                            "--code", str(code), "--no-check", "--detach",
                            "--log_dir", str(tmp_path / "log"), "--", "sleeper.py",
                            timeout=120)
    assert started.returncode == 0, started.stderr
    run_id = run_id_in(started.stdout)
    assert f"multihost stop {run_id}" in started.stdout
    wait_running(lab, run_id, 2)
    stopped = lab.multihost("stop", run_id, "--kill-wait", "1", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert leftovers(lab, 2, run_id) == {}
    status = status_json(lab, run_id)
    assert [n["state"] for n in status["nodes"]] == ["stopped", "stopped"]


def test_a_controller_killed_with_sigkill_leaves_the_job_to_status_and_stop(lab, tmp_path, code):
    hosts = hostfile(lab, tmp_path, 2)
    proc = lab.popen([sys.executable, "-m", "multihost", "run", "--hostfile", str(hosts),
                      "--launcher", "python", "--code", str(code), "--no-check", "--plain",
                      "--log_dir", str(tmp_path / "log"), "--", "sleeper.py"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                     text=True)
    try:
        run_id = run_started_by(lab, proc)
        wait_running(lab, run_id, 2)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    time.sleep(1.5)
    status = status_json(lab, run_id)             # from a new shell: the job goes on
    assert [n["state"] for n in status["nodes"]] == ["running", "running"]
    assert leftovers(lab, 2, run_id)
    stopped = lab.multihost("stop", "--kill-wait", "1", timeout=60)    # the last run
    assert stopped.returncode == 0, stopped.stderr
    assert leftovers(lab, 2, run_id) == {}


MODES = textwrap.dedent("""\
    import os, sys
    root = os.path.expanduser("~/.multihost")
    paths = [root, os.path.join(root, "runs")]
    for top, dirs, files in os.walk(os.path.join(root, "runs", sys.argv[1])):
        paths += [top] + [os.path.join(top, name) for name in files]
    for path in paths:
        print("%o %s" % (os.stat(path).st_mode & 0o777, path))
""")


def open_modes(lab, i: int, run_id: str) -> list:
    """Every path of the run's state on host i whose mode lets others (or the group) in."""
    lines = lab.host_run(i, [sys.executable, "-c", MODES, run_id], check=True).stdout.splitlines()
    assert len(lines) > 6, lines
    return [line for line in lines if line.split()[0] not in ("700", "600")]


def test_ranks_that_exit_at_once_succeed_and_leave_private_state(lab, tmp_path, code):
    # Issue 11: this crashed the supervisor two times in three.
    hosts = hostfile(lab, tmp_path, 2)
    for _ in range(3):
        result = lab.multihost("run", "--hostfile", str(hosts), "--nproc_per_node", "2",
                               "--code", str(code), "--launcher", "python", "--no-python",
                               "--plain", "--log_dir", str(tmp_path / "log"), "--",
                               "echo", "hello", timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.count("hello") == 4, result.stdout[-3000:]
        run_id = run_id_in(result.stderr)
        assert [n["state"] for n in status_json(lab, run_id)["nodes"]] == ["succeeded"] * 2
    for i in (1, 2):
        assert open_modes(lab, i, run_id) == []
    controller = lab.home / ".multihost"
    for path in (controller, controller / "runs", controller / "runs" / run_id):
        assert oct(path.stat().st_mode & 0o777) == "0o700", path


def test_one_run_per_host_unless_allow_concurrent(lab, tmp_path, code):
    hosts = hostfile(lab, tmp_path, 2)
    first = lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python",
                          "--code", str(code), "--no-check", "--detach", "--log_dir",
                          str(tmp_path / "log"), "--", "sleeper.py",
                          timeout=120)
    assert first.returncode == 0, first.stderr
    first_id = run_id_in(first.stdout)
    second_id = None
    try:
        busy = lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python",
                             "--code", str(code), "--no-check", "--no-sync", "--plain",
                             "--log_dir", str(tmp_path / "log"), "--",
                             "sleeper.py", timeout=120)
        assert busy.returncode == 5, busy.stderr
        assert f"busy: root's run {first_id} (since" in busy.stderr
        assert f"multihost stop {first_id}" in busy.stderr     # the fix names the run
        second = lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python",
                               "--code", str(code), "--no-check", "--no-sync", "--detach",
                               "--allow-concurrent", "--log_dir", str(tmp_path / "log"), "--",
                               "sleeper.py", timeout=120)
        assert second.returncode == 0, second.stderr
        second_id = run_id_in(second.stdout)
        wait_running(lab, second_id, 2)
        # Stopping one run never touches the other's processes.
        assert lab.multihost("stop", second_id, "--kill-wait", "1").returncode == 0
        assert leftovers(lab, 2, second_id) == {}
        assert all(len(lines) >= 2 for lines in leftovers(lab, 2, first_id).values())
        assert len(leftovers(lab, 2, first_id)) == 2
    finally:
        lab.multihost("stop", first_id, "--kill-wait", "1")
        if second_id:
            lab.multihost("stop", second_id, "--kill-wait", "1")
    assert leftovers(lab, 2, first_id) == {}


# -- paddle: a real paddle.distributed.launch (paddlepaddle from PyPI, CPU) ---------------
PADDLE_VENV_DEFAULT = "/var/cache/multihost-tests/paddle-venv"   # hosts see /var (not /tmp)


@pytest.fixture(scope="session")
def paddle_python() -> str:
    """A cached venv with paddlepaddle, only with MULTIHOST_TEST_PADDLE=1 (186 MiB to
    download, 866 MiB installed); MULTIHOST_PADDLE_VENV picks where it lives."""
    import os

    if os.environ.get("MULTIHOST_TEST_PADDLE") != "1":
        pytest.skip("set MULTIHOST_TEST_PADDLE=1 to test the paddle launcher")
    venv = Path(os.environ.get("MULTIHOST_PADDLE_VENV", PADDLE_VENV_DEFAULT))
    return cached_venv(venv, ["paddlepaddle==3.3.1"], "import paddle")


def test_paddle_launch_gives_trainer_ids_and_endpoints_in_ip_order(lab, tmp_path, paddle_python):
    hosts = hostfile(lab, tmp_path, 3)
    result = lab.multihost("run", "--hostfile", str(hosts), "--python", paddle_python,
                           "--launcher", "paddle", "--nproc_per_node", "2", "--start-port",
                           "17100", "--code", str(EXAMPLES), "--plain", "--log_dir",
                           str(tmp_path / "log"), "--", "ranks.py", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = {}
    for line in result.stdout.splitlines():
        match = re.search(r"^(\S+) \[\d+\]: paddle trainer_id=(\d) endpoint=(\S+) "
                          r"endpoints=(\S+)", line)
        if match:
            host, trainer, endpoint, endpoints = match.groups()
            seen[int(trainer)] = (host, endpoint, endpoints)
    assert sorted(seen) == [0, 1, 2, 3, 4, 5], result.stdout[-3000:]
    expected = ",".join(f"{lab.address(i)}:{port}" for i in (1, 2, 3) for port in (17100, 17101))
    for trainer, (host, endpoint, endpoints) in seen.items():
        assert host == lab.address(trainer // 2 + 1)     # trainers 0-1 on the first host...
        assert endpoint == f"{host}:{17100 + trainer % 2}"
        assert endpoints == expected
    # (paddle's launcher repeats local rank 0's lines in its own output: count ranks' only)
    assert len(re.findall(r"(?m)^\S+ \[\d\]: all_reduce sum=21 expected=21 ok$",
                          result.stdout)) == 6


def test_data_that_differs_between_hosts_stops_the_run_before_launch(lab, tmp_path, code):
    hosts = hostfile(lab, tmp_path, 2)
    for i, text in ((1, "v1"), (2, "v2")):
        lab.host_run(i, ["sh", "-c", f"mkdir -p /root/mhdata && echo {text} > /root/mhdata/a.txt"],
                     check=True)
    try:
        result = lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python",
                               "--code", str(code), "--no-check", "--data", "/root/mhdata",
                               "--plain", "--log_dir", str(tmp_path / "log"), "--", "sleeper.py",
                               timeout=120)
        assert result.returncode == 4, result.stderr        # a sync error: nothing started
        assert "mhdata" in result.stderr.strip().splitlines()[-1]
        assert not re.search(r"run \d{8}-", result.stderr)    # no run was announced
    finally:
        for i in (1, 2):
            lab.host_run(i, ["rm", "-rf", "/root/mhdata"])


def test_a_rank_whose_wrapper_is_killed_is_the_root_cause_not_the_peers_it_stopped(
        lab, tmp_path, code):
    """``kill -9`` of the process that matches the script may hit multihost's rank wrapper
    (it carries the script's command line): torchrun then stops the other ranks with
    SIGTERM; the rank killed, not one of those, is the root cause."""
    hosts = hostfile(lab, tmp_path, 2)
    proc = lab.popen([sys.executable, "-m", "multihost", "run", "--hostfile", str(hosts),
                      "--nproc_per_node", "2", "--code", str(code), "--no-check", "--kill-wait",
                      "2", "--plain", "--log_dir", str(tmp_path / "log"), "--", "sleeper.py"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_id = run_started_by(lab, proc)
        wait_running(lab, run_id, 2)
        deadline = time.monotonic() + 60
        while True:   # the rank's wrapper records itself once torchrun started it
            record = lab.host_run(2, ["cat", f"/root/.multihost/runs/{run_id}/rank.1.json"])
            if record.returncode == 0 and json.loads(record.stdout).get("pid"):
                break
            assert time.monotonic() < deadline, record.stderr
            time.sleep(0.3)
        wrapper = json.loads(record.stdout)["wrapper"][0]
        lab.host_run(2, ["kill", "-9", str(wrapper)], check=True)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    last = err.strip().splitlines()[-1]
    assert "rank 3 (local rank 1): killed by SIGKILL" in last, err[-3000:]
    status = status_json(lab, run_id)
    assert (status["root_cause"]["rank"], status["root_cause"]["node_rank"]) == (3, 1)
    assert leftovers(lab, 2, run_id) == {}
