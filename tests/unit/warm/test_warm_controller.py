"""The warm controller, as a user meets it: the second `multihost exec` (or sync, check...)
runs in a fork of the process the first one left, and nothing else about it differs:
output, exit status, input, directory, environment, signals. Real processes on this
machine (a host named localhost runs its commands as local subprocesses), no lab."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(word) for word in children.read().split()]
    except OSError:
        return []


class Warm:
    """multihost with a home of its own and the warm controller on; every server it
    starts is stopped at the end, by the pid it wrote."""

    def __init__(self, tmp: Path, package_parent: Path = REPO):
        # A short home: under pytest's deep temporary path a socket's name would not fit,
        # and the server would go to the shared fallback directory in /tmp.
        self.home = Path(tempfile.mkdtemp(prefix="mh-warm-"))
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.env = dict(os.environ, HOME=str(self.home), MULTIHOST_WARM="1",
                        PYTHONPATH=str(package_parent))
        self.dir = self.home / ".cache" / "multihost" / "warm"
        self.seen: set = set()

    def argv(self, *words: str) -> list:
        return [sys.executable, "-m", "multihost", *words]

    def run(self, *words: str, input: str = "", **env) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*words), input=input, capture_output=True, text=True,
                              cwd=self.cwd, env=dict(self.env, **env), timeout=60)

    def server(self, other_than: int = 0, wait: float = 15.0) -> int:
        """The pid of the warm controller up now (another than ``other_than``)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for pid_file in self.dir.glob("*.pid") if self.dir.exists() else ():
                try:
                    pid = int(pid_file.read_text())
                except (OSError, ValueError):
                    continue
                if pid != other_than and _alive(pid) and pid_file.with_suffix(".sock").exists():
                    self.seen.add(pid)
                    return pid
            time.sleep(0.05)
        raise AssertionError("no warm controller came up")

    def stop(self) -> None:
        for pid in self.seen:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def warm(tmp_path):
    handle = Warm(tmp_path)
    yield handle
    handle.stop()


# The command reports its grandparent: the warm controller when it ran in a fork of it.
ANCESTRY = "ps -o ppid= -p $PPID"
EXEC = ["exec", "--ips=localhost", "--"]


def test_the_next_command_runs_warm_and_looks_the_same(warm):
    first = warm.run(*EXEC, "true")
    assert first.returncode == 0, first.stderr
    server = warm.server()
    assert int(warm.run(*EXEC, ANCESTRY).stdout.split()[-1]) == server

    # Input, working directory, environment, output and exit status: as without it.
    script = "cat; pwd; echo \"$GREETING\"; echo to-stderr >&2; exit 3"
    hot = warm.run(*EXEC, script, input="from stdin\n", GREETING="hello")
    cold = warm.run(*EXEC, script, input="from stdin\n", GREETING="hello", MULTIHOST_WARM="0")
    assert (hot.returncode, hot.stdout, hot.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert hot.returncode == 3 and "from stdin" in hot.stdout and "hello" in hot.stdout
    assert str(warm.cwd) in hot.stdout and "to-stderr" in hot.stdout + hot.stderr
    # A bad flag is the same one line and status.
    bad_hot, bad_cold = warm.run("exec", "--no-such-flag"), warm.run(
        "exec", "--no-such-flag", MULTIHOST_WARM="0")
    assert (bad_hot.returncode, bad_hot.stderr) == (bad_cold.returncode, bad_cold.stderr) != (0, "")


def test_a_signal_to_the_command_reaches_it_and_its_status_comes_back(warm):
    warm.run(*EXEC, "true")
    server = warm.server()
    command = subprocess.Popen(warm.argv(*EXEC, "sleep 30"), cwd=warm.cwd, env=warm.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 15
    while not _children(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _children(server), "the command never started in the warm controller"
    time.sleep(0.3)  # the CLI's own interrupt handling in place
    command.send_signal(signal.SIGINT)
    _out, err = command.communicate(timeout=20)
    assert command.returncode == 130 and "multihost: interrupted" in err


def test_a_client_killed_leaves_no_command_behind(warm):
    warm.run(*EXEC, "true")
    server = warm.server()
    command = subprocess.Popen(warm.argv(*EXEC, "sleep 30"), cwd=warm.cwd, env=warm.env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not _children(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    (worker,) = _children(server)
    command.kill()
    command.wait()
    deadline = time.monotonic() + 15
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker), "the command outlived its client (a closed terminal's hang-up)"
    assert _alive(server)


def test_changed_code_is_never_served_warm(tmp_path):
    """An upgrade or an edit of multihost's files: the old warm controller ends, the
    command runs with the new code, and the next one is served by a fresh server."""
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "multihost", copy / "multihost",
                    ignore=shutil.ignore_patterns("__pycache__"))
    warm = Warm(tmp_path, package_parent=copy)
    try:
        warm.run(*EXEC, "true")
        old = warm.server()
        cli = copy / "multihost" / "cli.py"
        cli.write_text(cli.read_text().replace("(fix: see `", "(fix: read `"))
        assert int(warm.run(*EXEC, ANCESTRY).stdout.split()[-1]) != old
        new = warm.server(other_than=old)
        assert "(fix: read `multihost exec --help`)" in warm.run("exec", "--bad-flag").stderr
        deadline = time.monotonic() + 15
        while _alive(old) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(old)
        assert int(warm.run(*EXEC, ANCESTRY).stdout.split()[-1]) == new
    finally:
        warm.stop()


def test_another_network_namespace_is_never_served(warm):
    """A command started in another network namespace (a lab's controller, a container)
    must not run in this one's controller: it runs cold there."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a network namespace")
    warm.run(*EXEC, "true")
    server = warm.server()
    inside = subprocess.run(["unshare", "-n", *warm.argv(*EXEC, ANCESTRY)], capture_output=True,
                            text=True, cwd=warm.cwd, env=dict(warm.env, MULTIHOST_CONTROL_PERSIST="1"),
                            timeout=60)
    assert inside.returncode == 0, inside.stderr
    assert int(inside.stdout.split()[-1]) != server


@pytest.mark.parametrize("setting", [{"MULTIHOST_WARM": "0"}, {"MULTIHOST_CONTROL_PERSIST": "0"}])
def test_turned_off_it_leaves_nothing(warm, setting):
    assert warm.run(*EXEC, "true", **setting).returncode == 0
    time.sleep(1.0)
    assert not (warm.dir.exists() and list(warm.dir.glob("*.sock")))


def test_an_idle_warm_controller_ends_by_itself(warm):
    warm.run(*EXEC, "true", MULTIHOST_CONTROL_PERSIST="1")
    warm.env["MULTIHOST_CONTROL_PERSIST"] = "1"
    server = warm.server()
    deadline = time.monotonic() + 20
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server) and not list(warm.dir.glob("*"))   # nothing left behind


def test_the_script_and_its_client_import_almost_nothing():
    """What a warm command costs here is the interpreter and this: the script and the
    client must not pull in what a cold start pays for (re, typing, argparse...)."""
    script = str(REPO / "bin" / "multihost")
    probe = ("import sys; sys.argv = ['multihost']; "
             "import multihost.warm.client as c; c.run = lambda: None; "
             f"exec(compile(open({script!r}).read(), {script!r}, 'exec'), {{}}); "
             "print(' '.join(m for m in ('re', 'typing', 'argparse', 'dataclasses', 'socket', "
             "'json', 'enum', 'subprocess', 'signal', 'multihost.cli') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_what_owns_the_terminal_for_long_starts_cold():
    """A dashboard that holds the terminal for hours (`run`, `logs --follow`) is not a
    fork of the warm controller; the short everyday commands are."""
    from multihost.warm.wire import served_warm

    assert served_warm(["sync"]) and served_warm(["--plain", "logs", "--tail", "3"])
    assert served_warm(["exec", "--ips=a", "--", "tail", "-f", "x.log"])
    for argv in (["run", "--", "train.py"], ["logs", "--follow"], ["logs", "-f"], ["ssh", "0"],
                 ["lab", "up", "2"], ["fleetrun", "train.py"]):
        assert not served_warm(argv), argv


def test_a_warm_sync_answers_as_cold_and_still_saves_its_snapshot(warm, tmp_path):
    """A warm sync gives its status before it saves the snapshot of the code directory
    (multihost/afterwards.py); the output and status are a cold sync's, and the snapshot
    is saved all the same, so that the next sync skips the walk."""
    from multihost.remote.sync_fs import tree_key

    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    for i in range(20):
        (code / "pkg" / f"m{i}.py").write_text(f"x = {i}\n")
    sync = ("sync", "--ips=localhost", "--code", str(code), "--plain")
    assert warm.run(*sync, "--workdir", str(tmp_path / "wd")).returncode == 0
    warm.server()
    snapshot = warm.home / ".cache" / "multihost" / "hashes" / (tree_key(str(code)) + ".tree")
    results = {}
    for name, setting in (("warm", {}), ("cold", {"MULTIHOST_WARM": "0"})):
        (code / "pkg" / "m3.py").write_text(f"x = '{name}'\n")  # the same size each time
        time.sleep(0.2)  # an edit, then a command: not within the same few milliseconds
        before = snapshot.stat().st_mtime_ns
        done = warm.run(*sync, "--workdir", str(tmp_path / "wd"), **setting)
        deadline = time.monotonic() + 10
        while snapshot.stat().st_mtime_ns == before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert snapshot.stat().st_mtime_ns != before, f"the {name} sync saved no snapshot"
        results[name] = (done.returncode, done.stderr, re.sub(r"in [0-9.]+s", "", done.stdout))
    assert results["warm"] == results["cold"] and results["warm"][0] == 0
    assert "localhost: 1 file (" in results["warm"][2]
