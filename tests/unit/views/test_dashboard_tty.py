"""The dashboard as a user meets it: the real CLI in a real terminal (tmux), keys sent,
the screen read back. A run on this machine alone (no hosts given: no sshd involved).

Waits are generous deadlines for something to appear, never timing assertions.
"""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

# Every rank prints progress; on SIGTERM it takes a few seconds to clean up, so the
# grace period is long enough to be seen.
JOB = """\
import os, signal, sys, time
rank = int(os.environ.get("RANK", "0"))
def term(*_):
    print("rank %d got SIGTERM, cleaning up" % rank, flush=True)
    time.sleep(2)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
for step in range(1, 100000):
    print("epoch: 0, step:%d, train_loss: 0.5, speed: %d" % (step, 1000 + rank), flush=True)
    time.sleep(0.3)
"""


class Terminal:
    """One tmux session on a private socket, running one command."""

    def __init__(self, tmp_path: Path, command: str, env=None):
        self.socket = str(tmp_path / f"tmux.{time.monotonic_ns()}.sock")  # one server each
        (tmp_path / "home").mkdir(exist_ok=True)
        self.env = {"HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO),
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TERM": "xterm-256color",
                    **(env or {})}
        self.tmp = tmp_path
        self.start(command)

    def start(self, command: str) -> None:
        exports = " ".join(f"{k}={v!r}" for k, v in self.env.items())
        line = f"cd {str(self.tmp / 'work')!r} && env -i {exports} {command}; echo EXIT=$?; sleep 600"
        subprocess.run(["tmux", "-S", self.socket, "new-session", "-d", "-x", "150", "-y", "45",
                        "-s", "t", line], check=True)

    def screen(self, escapes: bool = False) -> str:
        argv = ["tmux", "-S", self.socket, "capture-pane", "-p", "-t", "t"] + (["-e"] if escapes else [])
        return subprocess.run(argv, capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "-S", self.socket, "send-keys", "-t", "t", *keys], check=True)

    def wait_for(self, pattern: str, deadline: float = 60.0) -> str:
        end = time.time() + deadline
        while time.time() < end:
            text = self.screen()
            if re.search(pattern, text):
                return text
            if "EXIT=" in text:  # the command ended without it: no use waiting
                break
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} never showed; the screen:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)


def multihost(*words: str) -> str:
    return f"{sys.executable} -m multihost " + " ".join(words)


RUN = ("run", "--nproc_per_node", "2", "--launcher", "python", "--no-check",
       "--allow-concurrent", "--kill-wait", "20")


@pytest.fixture
def term(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "job.py").write_text(JOB)
    made = []

    def make(command: str, env=None) -> Terminal:
        made.append(Terminal(tmp_path, command, env))
        return made[-1]

    yield make
    for terminal in made:
        terminal.close()
    # A test that failed half way leaves its run going (it outlives its terminal, as
    # runs do): stop it, so that no later test meets it.
    if made and (tmp_path / "home" / ".multihost" / "last").exists():
        subprocess.run([sys.executable, "-m", "multihost", "stop"], env=made[0].env,
                       cwd=tmp_path / "work", capture_output=True, timeout=120)


def test_ctrl_c_is_acknowledged_at_once_and_the_rows_say_stopping(term):
    t = term(multihost(*RUN, "--", "job.py"))
    t.wait_for(r"step:[3-9]")
    t.keys("C-c")
    text = t.wait_for(r"stopping: SIGTERM sent to 1 host, up to 20 s \(Ctrl-C again to kill now\)")
    rows = [line for line in text.splitlines() if re.match(r"│\s*\d+\s*│ 127\.0\.0\.1", line)]
    assert rows and all("stopping" in row for row in rows)
    t.wait_for("got SIGTERM")
    t.keys("C-c")  # the second skips the grace
    text = t.wait_for(r"EXIT=130")
    lines = text.splitlines()
    # The footer and the last frame end cleanly: our final words start their own line.
    assert any(line.startswith("multihost: run ") and "stopped on every host (interrupted)" in line
               for line in lines)
    run_id = re.search(r"multihost run (\d{8}-\d{6}-[0-9a-f]{4})", text).group(1)
    assert f"multihost: logs: log/latest/workerlog.N (this run: log/{run_id})" in lines
    status = subprocess.run([sys.executable, "-m", "multihost", "status"], capture_output=True,
                            text=True, env=t.env, cwd=str(t.tmp / "work"))
    assert status.stdout.startswith(f"run {run_id}: stopped (exit 130)"), status.stdout


def test_ctrl_c_before_the_launch_says_interrupted_on_a_line_of_its_own(term):
    t = term(multihost(*RUN, "--setup", "'sleep 60'", "--", "job.py"))
    t.wait_for(r"setup on 1 host")
    t.keys("C-c")
    text = t.wait_for(r"EXIT=130")
    assert "multihost: interrupted" in text.splitlines(), text


def test_s_asks_first_then_stops_the_run_as_a_stop_from_the_dashboard(term):
    t = term(multihost(*RUN, "--ranks", "--", "job.py"))
    text = t.wait_for(r"step:[2-9]")
    assert "rank 0" in text and "rank 1" in text       # --ranks: one row per rank
    t.keys("s")
    t.wait_for(r"stop the run on every host\? \[y\] yes")
    t.keys("n")  # anything but y: nothing happens
    t.wait_for(r"\[s\] stop the run")
    assert "stopping" not in t.screen()
    t.keys("s")
    t.wait_for(r"stop the run on every host\?")
    t.keys("y")
    t.wait_for(r"stopping \(stopped from the dashboard")
    text = t.wait_for(r"EXIT=143")
    assert "stopped on every host (from the dashboard)" in text and "Ctrl-C" not in text


def test_no_color_keeps_the_dashboard_and_q_goes_on_in_plain_lines(term):
    t = term(multihost(*RUN, "--", "job.py"), env={"NO_COLOR": "1"})
    text = t.wait_for(r"\[q\] plain lines")
    assert "state" in text and "uptime" in text      # the dashboard, not plain lines
    coloured = t.screen(escapes=True)
    assert not re.search(r"\x1b\[[0-9;]*(3[0-7]|38;[25];[0-9;]+|9[0-7])m", coloured)
    t.keys("q")
    t.wait_for(r"dashboard closed; following the run in plain lines")
    t.wait_for(r"127\.0\.0\.1 \[1\]: epoch: 0, step:\d+")   # still followed, plain
    t.keys("C-c")
    t.wait_for(r"stopping: SIGTERM sent to 1 host")
    t.keys("C-c")
    t.wait_for(r"EXIT=130")


def test_d_detaches_and_logs_follow_has_the_same_dashboard_and_keys(term):
    t = term(multihost(*RUN, "--", "job.py"))
    t.wait_for(r"step:[2-9]")
    t.keys("d")
    text = t.wait_for(r"EXIT=0")
    run_id = re.search(r"multihost status (\d{8}-\d{6}-[0-9a-f]{4})", text).group(1)
    assert any(line.startswith("run ") and "is running" in line for line in text.splitlines())
    t.close()
    # The run goes on: reattach to it with `logs --follow`, a dashboard with its keys.
    follow = term(multihost("logs", "--follow"))
    text = follow.wait_for(r"\[s\] stop the run")
    assert run_id in text and "127.0.0.1" in text
    follow.keys("s")
    follow.wait_for(r"stop the run on every host\?")
    follow.keys("y")
    text = follow.wait_for(r"EXIT=143", deadline=90)
    assert "stopped" in text
