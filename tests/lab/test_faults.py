"""Faults a cluster throws at a long job, each injected for real in the lab (issue 7).

Covered elsewhere, not repeated here: the controller SIGKILLed mid-run then `logs
--follow` (test_logs.py), a rank exiting 3, Ctrl-C, --detach + stop, a second run refused
or --allow-concurrent (test_run.py), a single-host sync killed mid-file (test_sync.py).

Every process a test starts on a host carries a token in its argv, so "no orphan" is
checked on each host's whole process table, even for processes that dropped
MULTIHOST_RUN_ID from their environment or left their session.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest

from multihost.lab.config import bridge_port, ctl_netns

# Every process whose argv or environment holds one of the needles (a run id, a token).
SCAN = textwrap.dedent("""\
    import os, sys
    needles = [n.encode() for n in sys.argv[1:]]
    me = {os.getpid(), os.getppid()}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in me:
            continue
        try:
            env = open("/proc/%s/environ" % pid, "rb").read()
            argv = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\\0", b" ")
        except OSError:
            continue
        if any(n in env or n in argv for n in needles):
            print(pid, argv.decode(errors="replace")[:120])
""")

# A rank that starts, per its argv: a plain child, a child in its own session that
# ignores SIGTERM, and a double-forked grandchild in its own session with
# MULTIHOST_RUN_ID removed (re-parented to the supervisor once its parent exits). Then:
# `fail R S` rank R exits 3 after S s; `signal R S` rank R kills itself with SIGSEGV
# after S s; `finish R S` rank R exits 0 after S s. Every other rank sleeps.
RANK = textwrap.dedent("""\
    import os, signal, socket, subprocess, sys, time
    token, mode, who, after = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    rank = int(os.environ["RANK"])
    sleep = [sys.executable, "-c", "import time; time.sleep(600)", token, "child"]
    subprocess.Popen(sleep)
    subprocess.Popen([sys.executable, "-c", "import signal, time; "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
                      token, "session"], start_new_session=True)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            env = {k: v for k, v in os.environ.items() if k != "MULTIHOST_RUN_ID"}
            os.execve(sys.executable, sleep[:-1] + ["daemon"], env)
        os._exit(0)
    os.wait()
    print("up host=%s rank=%d" % (socket.gethostname(), rank), flush=True)
    if rank == who:
        time.sleep(after)
        print("rank %d: %s now" % (rank, mode), flush=True)
        if mode == "signal":
            os.kill(os.getpid(), signal.SIGSEGV)
        sys.exit(3 if mode == "fail" else 0)
    time.sleep(600)
""")

# Numbered lines, for "nothing lost, nothing repeated".
NUMBERS = textwrap.dedent("""\
    import os, sys, time
    rank = os.environ["RANK"]
    for i in range(int(sys.argv[1])):
        print("rank %s line %d" % (rank, i), flush=True)
        time.sleep(float(sys.argv[2]))
""")
LINE = re.compile(r"^198\.18\.0\.\d+ \[(\d+)\]: rank (\d+) line (\d+)$")
RUN_ID = re.compile(r"\b(\d{8}-\d{6}-[0-9a-f]{4})\b")


@pytest.fixture
def code(tmp_path: Path) -> Path:
    directory = tmp_path / f"faults-{secrets.token_hex(3)}"   # its own workdir on hosts
    directory.mkdir()
    (directory / "rank.py").write_text(RANK)
    (directory / "numbers.py").write_text(NUMBERS)
    return directory


@pytest.fixture
def token() -> str:
    return f"mhfault{secrets.token_hex(4)}"


# A host counts as lost after this much silence in the tests that cut a link mid-run
# (MULTIHOST_LOST_AFTER, 15 s by default): what is said and done after it is the same.
LOST_AFTER = 6


def fast_lost(lab) -> Dict[str, str]:
    return lab.env_with(MULTIHOST_LOST_AFTER=str(LOST_AFTER))


def ips(lab, n: int) -> str:
    return ",".join(lab.addresses[:n])


def run_argv(lab, code: Path, n: int, *extra: str, check: bool = False) -> List[str]:
    return ["run", "--ips", ips(lab, n), "--python", sys.executable, "--launcher", "python",
            "--code", str(code), *([] if check else ["--no-check"]), "--plain",
            "--log_dir", str(code.parent / "log"), *extra]


def found_on(lab, hosts, *needles: str) -> Dict[int, List[str]]:
    """{host i: [process lines]} of every process matching a needle, per host."""
    found = {}
    for i in hosts:
        result = lab.host_run(i, [sys.executable, "-c", SCAN, *needles], check=True)
        if result.stdout.strip():
            found[i] = result.stdout.strip().splitlines()
    return found


def status_json(lab, run_id: str) -> dict:
    result = lab.multihost("status", run_id, "--json", timeout=60)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not after {timeout}s"
        time.sleep(0.3)


class Controller:
    """`multihost ARGS` started in the background, its output lines timestamped as they
    come (so a test can tell when something was said)."""

    def __init__(self, lab, args: List[str], **kw):
        self.proc = lab.popen([sys.executable, "-m", "multihost", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)
        self.lines: List[tuple] = []      # (time.monotonic(), "out"|"err", line)
        self.threads = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                        for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for thread in self.threads:
            thread.start()

    def _read(self, stream, name: str) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), name, line.rstrip("\n")))

    def text(self, name: str) -> str:
        return "\n".join(line for _, n, line in list(self.lines) if n == name)

    def when(self, pattern: str):
        """The time of the first line matching pattern, or None."""
        for at, _, line in list(self.lines):
            if re.search(pattern, line):
                return at
        return None

    def run_id(self, timeout: float = 60) -> str:
        def seen():
            match = RUN_ID.search(self.text("err") + "\n" + self.text("out"))
            assert match or self.proc.poll() is None, f"exited: {self.text('err')[-2000:]}"
            return match.group(1) if match else None
        return wait_for(seen, timeout, "no run id announced")

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            self.kill()
        for thread in self.threads:
            thread.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def running_everywhere(lab, run_id: str, nodes: int, procs_per_node: int = 1):
    def check():
        status = status_json(lab, run_id)
        return [n["state"] for n in status["nodes"]] == ["running"] * nodes and \
            all(n["procs"] for n in status["nodes"])
    wait_for(check, 90, f"run {run_id} never ran on {nodes} hosts")


def up_lines(controller: Controller, ranks: int):
    wait_for(lambda: controller.text("out").count(" up host=") >= ranks, 90,
             f"not every rank said it was up: {controller.text('err')[-2000:]}")


# -- before the start -------------------------------------------------------------------
@pytest.mark.parametrize("skip", [(), ("--no-check",), ("--no-check", "--no-sync")],
                         ids=["at-check", "at-sync", "at-prepare"])
def test_an_unreachable_host_before_the_start_starts_nothing_anywhere(lab, code, token, skip):
    """Whichever step meets the dead host first (the preflight, the sync, or with neither
    the prepare step, which takes each host's lock), nothing starts on the others, and no
    lock is left behind on them."""
    if "--no-sync" in skip:   # the code must be there already: prepare meets the dead host
        synced = lab.multihost("sync", "--ips", ips(lab, 3), "--code", str(code), "--plain")
        assert synced.returncode == 0, synced.stderr
    with lab.cut_link(2):
        result = lab.multihost(*run_argv(lab, code, 3, "--connect-timeout", "3", *skip, "--",
                                         "rank.py", token, "none", "-1", "0", check=not skip),
                               timeout=120)
    # check: 3; sync: 4; prepare: 255, ssh's status for a host it could not reach.
    assert result.returncode == {0: 3, 1: 4, 2: 255}[len(skip)], result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("multihost: 198.18.0.12: ") and "(fix: " in last, last
    assert "Traceback" not in result.stderr
    assert found_on(lab, (1, 2, 3), token) == {}
    # The hosts that were reached are free for the next run (no lock kept).
    again = lab.multihost(*run_argv(lab, code, 1, "--", "rank.py", token, "finish",
                                    "0", "0"), timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert found_on(lab, (1,), token) == {}


# -- a link cut mid-run -------------------------------------------------------------------
def test_a_link_cut_mid_run_is_detected_the_others_stopped_and_stop_cleans_it_after_heal(
        lab, code, token):
    controller = Controller(lab, run_argv(lab, code, 3, "--kill-wait", "1", "--",
                                          "rank.py", token, "none", "-1", "0"), env=fast_lost(lab))
    run_id = None
    try:
        run_id = controller.run_id()
        up_lines(controller, 3)
        with lab.cut_link(2):
            cut = time.monotonic()
            code_ = controller.wait(60)
            ended = time.monotonic() - cut
            lost_said = controller.when(r"198\.18\.0\.12 \(node 1\) lost")
            assert lost_said is not None, controller.text("err")[-2000:]
            print(f"lost said {lost_said - cut:.1f}s after the cut")
            # LOST_AFTER s of silence, then said; then the teardown (shared cores)
            assert lost_said - cut <= LOST_AFTER + 1.5, lost_said - cut
            assert ended < LOST_AFTER + 10, ended
            assert code_ == 255, controller.text("err")[-2000:]
            last = controller.text("err").strip().splitlines()[-1]
            assert last.startswith("multihost: 198.18.0.12: ") and "host lost" in last, last
            assert f"no answer for {LOST_AFTER}s" in last, last
            # The others were stopped, all of their processes; the cut host goes on.
            assert found_on(lab, (1, 3), token, run_id) == {}
            assert len(found_on(lab, (2,), token)[2]) >= 4     # rank, child, session, daemon
        status = lab.multihost("status", run_id, "--json", timeout=60)
        assert json.loads(status.stdout)["root_cause"]["host"] == "198.18.0.12"
        stopped = lab.multihost("stop", run_id, "--kill-wait", "1", timeout=90)
        assert stopped.returncode == 0, stopped.stderr
        assert found_on(lab, (1, 2, 3), token, run_id) == {}
    finally:
        controller.kill()
        if run_id:
            lab.multihost("stop", run_id, "--kill-wait", "0", timeout=90)


# -- sshd dies mid-run ----------------------------------------------------------------------
def sshd_sessions(lab, i: int) -> List[int]:
    """Pids of host i's sshd session processes (those serving connections, not the
    listener), read from its process table."""
    out = lab.host_run(i, ["ps", "-eo", "pid=,args="], check=True).stdout
    return [int(line.split()[0]) for line in out.splitlines()
            if re.match(r"\s*\d+ sshd: ", line)]


@contextlib.contextmanager
def sshd_killed(lab, i: int):
    """Host i's sshd killed with its sessions: every connection to it drops and no new
    one is accepted, while the host's other processes (the job) live on."""
    with lab.sshd_stopped(i):
        sessions = sshd_sessions(lab, i)
        assert sessions, lab.host_run(i, ["ps", "-eo", "pid=,args="]).stdout
        for pid in sessions:
            lab.host_run(i, ["kill", "-KILL", str(pid)])
        yield


def test_sshd_killed_mid_run_training_goes_on_and_logs_resume(lab, code):
    controller = Controller(lab, run_argv(lab, code, 2, "--nproc_per_node", "2", "--",
                                          "numbers.py", "200", "0.05"), cwd=str(code))
    try:
        controller.run_id()
        wait_for(lambda: re.search(r"\[2\]: rank 2 line 10$", controller.text("out"), re.M), 60,
                 "host 2 never printed")
        with sshd_killed(lab, 2):
            gone = time.monotonic()
            time.sleep(7)
            assert controller.proc.poll() is None, controller.text("err")[-2000:]
            # The controller says so at once, and that it keeps trying.
            assert re.search(r"198\.18\.0\.12 \(node 1\) running: contact lost \(.*\); retrying",
                             controller.text("err")), controller.text("err")[-3000:]
        back = time.monotonic()
        assert back - gone < 14      # under the 15 s that would make the host lost
        wait_for(lambda: controller.when(r"198\.18\.0\.12 \(node 1\) running: contact restored"),
                 20, "contact never restored")
        assert controller.wait(120) == 0, controller.text("err")[-3000:]
    finally:
        controller.kill()
    seen: Dict[int, List[int]] = {}
    for line in controller.text("out").splitlines():
        match = LINE.match(line)
        if match:
            seen.setdefault(int(match.group(1)), []).append(int(match.group(3)))
    # Training went on through the outage, and every line came through exactly once.
    assert seen == {rank: list(range(200)) for rank in range(4)}
    resumed = controller.when(r"\[2\]: rank 2 line 199$")
    assert resumed is not None and resumed > back


# -- ranks that die, hang or fork -----------------------------------------------------------
def test_a_rank_killed_by_a_signal_is_the_named_root_cause_and_nothing_is_left(lab, code, token):
    result = lab.multihost(*run_argv(lab, code, 2, "--nproc_per_node", "2", "--kill-wait", "1",
                                     "--", "rank.py", token, "signal", "3", "2"), timeout=120)
    assert result.returncode == 128 + signal.SIGSEGV, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("multihost: 198.18.0.12: ") and "rank 3" in last \
        and "SIGSEGV" in last and "(fix: " in last, last
    run_id = RUN_ID.search(result.stderr).group(1)
    # No orphan: not the ranks, their children, a session leader ignoring SIGTERM, nor a
    # double-forked daemon that dropped MULTIHOST_RUN_ID.
    assert found_on(lab, (1, 2), token, run_id) == {}


def test_a_rank_that_forks_grandchildren_leaves_no_orphan_when_another_fails(lab, code, token):
    result = lab.multihost(*run_argv(lab, code, 3, "--kill-wait", "1", "--",
                                     "rank.py", token, "fail", "0", "2"), timeout=120)
    assert result.returncode == 3, result.stderr[-3000:]
    assert result.stdout.count(" up host=") == 3
    run_id = RUN_ID.search(result.stderr).group(1)
    assert found_on(lab, (1, 2, 3), token, run_id) == {}


def test_wait_ends_the_run_s_seconds_after_the_first_rank_exits(lab, code, token):
    controller = Controller(lab, run_argv(lab, code, 2, "--wait", "4", "--kill-wait", "1", "--",
                                          "rank.py", token, "finish", "0", "1"))
    try:
        assert controller.wait(120) == 1, controller.text("err")[-3000:]
    finally:
        controller.kill()
    first_exit = controller.when(r"rank 0: finish now")
    ended = max(at for at, _, _ in controller.lines)
    assert first_exit is not None, controller.text("out")
    assert 4 - 0.5 <= ended - first_exit <= 4 + 1 + 6, ended - first_exit  # S, grace, slack
    last = controller.text("err").strip().splitlines()[-1]
    assert "--wait" in last and "198.18.0.12" in last, last
    run_id = RUN_ID.search(controller.text("err")).group(1)
    assert found_on(lab, (1, 2), token, run_id) == {}


# -- two runs on the same hosts ---------------------------------------------------------------
def test_stopping_one_of_two_runs_on_the_same_hosts_never_touches_the_other(lab, code):
    tokens, run_ids = [f"mhfault{secrets.token_hex(4)}" for _ in range(2)], []
    try:
        for token in tokens:
            started = lab.multihost(*run_argv(lab, code, 2, "--detach", "--allow-concurrent",
                                              "--", "rank.py", token, "none", "-1", "0"),
                                    timeout=120)
            assert started.returncode == 0, started.stderr[-2000:]
            run_ids.append(RUN_ID.search(started.stdout).group(1))
        for token in tokens:  # rank, child, session leader, daemon: on both hosts
            wait_for(lambda: all(len(v) >= 4 for v in found_on(lab, (1, 2), token).values())
                     and len(found_on(lab, (1, 2), token)) == 2, 60, "not every process is up")
        before = found_on(lab, (1, 2), tokens[1])
        stopped = lab.multihost("stop", run_ids[0], "--kill-wait", "1", timeout=90)
        assert stopped.returncode == 0, stopped.stderr
        assert found_on(lab, (1, 2), tokens[0], run_ids[0]) == {}
        assert found_on(lab, (1, 2), tokens[1]) == before          # the same processes
        assert [n["state"] for n in status_json(lab, run_ids[1])["nodes"]] == ["running"] * 2
    finally:
        for run_id in run_ids:
            lab.multihost("stop", run_id, "--kill-wait", "0", timeout=90)
    assert found_on(lab, (1, 2), *tokens) == {}


# -- sync under fire --------------------------------------------------------------------------
def on_host(lab, i: int, path: str) -> Path:
    """Host i's file at absolute ``path`` (under /root), seen from outside the lab."""
    return lab.lab.paths.host_root(i) / Path(path).relative_to("/root")


def tree(root: Path) -> Dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@contextlib.contextmanager
def slow_links(lab, hosts):
    """The hosts' links shaped to 40 Mbit/s (tbf; this kernel has no netem), restored."""
    ns = ctl_netns(lab.name)
    for i in hosts:
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", bridge_port(i),
                        "root", "tbf", "rate", "40mbit", "burst", "262144", "latency", "400ms"],
                       check=True)
    try:
        yield
    finally:
        for i in hosts:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", bridge_port(i),
                            "root"], capture_output=True)


def test_the_controller_killed_mid_sync_leaves_no_half_written_file_on_any_host(lab, code):
    workdir = f"/root/sync-{secrets.token_hex(3)}"
    (code / "model.bin").write_bytes(os.urandom(12 << 20))
    whole = tree(code)
    dirs = [on_host(lab, i, workdir) for i in (1, 2, 3)]
    proc = lab.popen([sys.executable, "-m", "multihost", "sync", "--ips", ips(lab, 3), "--code",
                      str(code), "--workdir", workdir, "--plain"], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        with slow_links(lab, (1, 2, 3)):
            def mid_file():
                try:
                    return any(p.name.startswith(".mh-tmp.") and p.stat().st_size > (1 << 20)
                               for d in dirs if d.is_dir() for p in d.iterdir())
                except FileNotFoundError:   # renamed into place while we looked
                    return False
            wait_for(mid_file, 30, "the transfer never started")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            wait_for(lambda: not any(p.name.startswith(".mh-tmp.") for d in dirs if d.is_dir()
                                     for p in d.iterdir()), 15, "temporary files left behind")
        for d in dirs:  # each file there is whole: absent or exactly the source's
            for name, digest in (tree(d) if d.is_dir() else {}).items():
                if name != ".multihost-incomplete":   # the mark of a tree left half written
                    assert whole.get(name) == digest, (d, name)
        done = lab.multihost("sync", "--ips", ips(lab, 3), "--code", str(code), "--workdir",
                             workdir, "--plain", timeout=120)
        assert done.returncode == 0, done.stderr
        assert all(tree(d) == whole for d in dirs)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for i in (1, 2, 3):
            lab.host_run(i, ["rm", "-rf", workdir])


def test_a_killed_master_connection_costs_the_next_sync_nothing_but_time(lab, code):
    """The OpenSSH master a sync left behind is killed (its socket stays, stale): the
    next sync still finds every host, by the paramiko path, and leaves a new master."""
    workdir = f"/root/sync-{secrets.token_hex(3)}"
    sync = ["sync", "--ips", ips(lab, 2), "--code", str(code), "--workdir", workdir, "--plain"]
    lab.stop_masters()
    assert lab.multihost(*sync).returncode == 0

    killed = lab.wait_for_masters((1, 2))   # this sync's
    for pid in killed:   # started by the sync above, in this test's lab
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not {lab.address(1), lab.address(2)} & set(lab.masters()), 10,
             "the masters did not die")
    assert lab.control_sockets()   # stale sockets stay behind
    (code / "train.py").write_text("print('after the masters died')\n")
    started = time.monotonic()
    done = lab.multihost(*sync, timeout=120)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 20
    for i in (1, 2):
        assert (on_host(lab, i, workdir) / "train.py").read_text() == "print('after the masters died')\n"
    assert not set(lab.wait_for_masters((1, 2))) & set(killed)
    for i in (1, 2):
        lab.host_run(i, ["rm", "-rf", workdir])


def test_a_full_disk_on_one_host_during_sync_is_named_and_leaves_no_partial_file(lab, code):
    workdir = f"/root/sync-{secrets.token_hex(3)}"
    (code / "model.bin").write_bytes(os.urandom(3 << 20))
    whole = tree(code)
    lab.host_run(2, ["mkdir", "-p", workdir], check=True)
    # mode 0755: a tmpfs is 1777 by default, a workdir anyone may write (refused)
    lab.host_run(2, ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", workdir],
                 check=True)
    try:
        result = lab.multihost("sync", "--ips", ips(lab, 3), "--code", str(code), "--workdir",
                               workdir, "--plain", timeout=120)
        assert result.returncode == 4, result.stderr[-2000:]
        assert "Traceback" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("multihost: ")]
        assert any(line.startswith("multihost: 198.18.0.12: ") and "space" in line
                   and "(fix: " in line for line in errors), result.stderr[-2000:]
        assert not any("198.18.0.11" in line or "198.18.0.13" in line for line in errors)
        for i in (1, 3):
            assert tree(on_host(lab, i, workdir)) == whole       # the other hosts: intact
        listing = lab.host_run(2, ["find", workdir, "-type", "f", "-printf", "%P %s\n"],
                               check=True).stdout.split("\n")
        sizes = dict(line.rsplit(" ", 1) for line in listing if line)
        assert not [name for name in sizes if ".mh-tmp." in name], sizes
        assert "model.bin" not in sizes                                 # never half there
    finally:
        lab.host_run(2, ["umount", workdir])
        for i in (1, 2, 3):
            lab.host_run(i, ["rm", "-rf", workdir])

