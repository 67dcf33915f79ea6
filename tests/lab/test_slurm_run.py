"""`multihost run --slurm` from outside an allocation, the dashboard inside one, and
`fetch` and `ssh` for a run whose nodes are steps of a Slurm job, on real Slurm
(`multihost lab up 2 --slurm`: slurmctld on ctl, slurmd on h1 and h2)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_run import leftovers, run_id_in
from test_run import paddle_python  # noqa: F401 (the cached paddle venv)
from test_slurm import cmdline, shared_dir, sleeper_code, slurm_lab  # noqa: F401 (fixtures)

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


def slurm_jobs(lab) -> str:
    return lab.run(["squeue", "-h", "-o", "%i %T"], check=True).stdout.strip()


# -- multihost run --slurm, from outside an allocation -------------------------------------
def test_run_slurm_puts_ranks_in_slurms_order_and_a_failing_rank_is_its_one_line_error(
        slurm_lab, tmp_path):
    r = slurm_lab.multihost("run", "--slurm", "-N", "2", "--nproc_per_node", "2", "--code",
                            str(EXAMPLES), "--no-check", "--kill-wait", "2", "--plain",
                            "--log_dir", str(tmp_path / "log"), "--", "ranks.py",
                            "--fail-rank", "3", "--exit-code", "3", "--after", "2", timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 3, out[-3000:]
    seen = {}
    for line in out.splitlines():
        m = re.search(r"host=(h\d) rank=(\d) local_rank=(\d) world_size=(\d) .* node_rank=(\d)", line)
        if m:
            seen[int(m.group(2))] = (m.group(1), int(m.group(3)), int(m.group(4)), int(m.group(5)))
    assert seen == {0: ("h1", 0, 4, 0), 1: ("h1", 1, 4, 0), 2: ("h2", 0, 4, 1), 3: ("h2", 1, 4, 1)}
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("multihost: h2: run ") and "rank 3 (local rank 1): exit 3" in last, last
    assert leftovers(slurm_lab, 2, run_id_in(r.stderr)) == {}
    assert slurm_jobs(slurm_lab) == ""


def test_a_paddle_job_through_run_slurm_names_the_trainer_that_died_in_slurms_order(
        slurm_lab, tmp_path, paddle_python):
    r = slurm_lab.multihost("run", "--slurm", "-N", "2", "--python", paddle_python, "--launcher",
                            "paddle", "--nproc_per_node", "2", "--start-port", "17160", "--code",
                            str(EXAMPLES), "--no-check", "--kill-wait", "2", "--plain",
                            "--log_dir", str(tmp_path / "log"), "--", "ranks.py",
                            "--fail-rank", "2", "--exit-code", "3", "--after", "2", timeout=300)
    assert r.returncode == 3, r.stderr[-3000:]
    seen = sorted(re.findall(r"(?m)^(\S+) \[\d+\]: paddle trainer_id=(\d) ", r.stdout))
    assert seen == [("h1", "0"), ("h1", "1"), ("h2", "2"), ("h2", "3")], r.stdout[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("multihost: h2: run ") and "rank 2 (local rank 0): exit 3" in last, last
    assert leftovers(slurm_lab, 2, run_id_in(r.stderr)) == {}
    assert slurm_jobs(slurm_lab) == ""


def start_slurm_run(lab, tmp_path: Path) -> subprocess.Popen:
    """A --slurm run of 2 x 2 sleepers, returned once every rank is up."""
    proc = lab.popen([sys.executable, "-m", "multihost", "run", "--slurm", "-N", "2",
                      "--launcher", "python", "--nproc_per_node", "2", "--code",
                      str(sleeper_code(tmp_path)), "--no-check", "--kill-wait", "2", "--plain",
                      "--log_dir", str(tmp_path / "log"), "--", "sleeper.py"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                     start_new_session=True)
    deadline = time.monotonic() + 120
    while True:     # both nodes' ranks up
        found = [lab.host_run(i, ["pgrep", "-f", "sleeper.py"]).stdout.split() for i in (1, 2)]
        if all(len(pids) >= 2 for pids in found):
            return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(proc.communicate()[1][-2000:])
        time.sleep(0.5)


def ended(proc: subprocess.Popen, timeout: float = 90):
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ctrl_c_of_run_slurm_leaves_nothing_on_any_node_and_ends_the_job(slurm_lab, tmp_path):
    proc = start_slurm_run(slurm_lab, tmp_path)
    assert b"multihost" in cmdline(proc.pid)    # the controller itself, as a terminal's ^C
    os.kill(proc.pid, signal.SIGINT)
    out, err = ended(proc)
    assert "stopped on every host (interrupted)" in err, err[-2000:]
    assert leftovers(slurm_lab, 2, run_id_in(err)) == {}
    assert slurm_jobs(slurm_lab) == ""


def test_stop_from_another_shell_ends_a_run_slurm_and_its_job(slurm_lab, tmp_path):
    proc = start_slurm_run(slurm_lab, tmp_path)
    try:
        stop = slurm_lab.multihost("stop", timeout=90)
    finally:
        out, err = ended(proc)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    last = err.strip().splitlines()[-1]
    assert re.search(r"^multihost: run \S+ was stopped", last), err[-2000:]
    assert err.count(") stopped: multihost stop from ctl") == 2, err[-2000:]
    assert proc.returncode != 0
    assert leftovers(slurm_lab, 2, run_id_in(err)) == {}
    assert slurm_jobs(slurm_lab) == ""


# -- in a terminal, inside salloc ----------------------------------------------------------
class Terminal:
    """A tmux session on ctl (a real terminal) running one shell line."""

    def __init__(self, lab, tmp_path: Path, line: str):
        self.lab, self.socket = lab, str(tmp_path / "tmux.sock")
        lab.run(["tmux", "-S", self.socket, "new-session", "-d", "-x", "150", "-y", "45", "-s",
                 "t", f"{line}; echo EXIT=$?; sleep 600"], check=True)

    def screen(self) -> str:
        return self.lab.run(["tmux", "-S", self.socket, "capture-pane", "-p", "-t", "t"]).stdout

    def keys(self, *keys: str) -> None:
        self.lab.run(["tmux", "-S", self.socket, "send-keys", "-t", "t", *keys], check=True)

    def wait_for(self, *patterns: str, deadline: float = 90.0) -> str:
        end = time.monotonic() + deadline
        while True:
            text = self.screen()
            if all(re.search(p, text) for p in patterns):
                return text
            assert "EXIT=" not in text and time.monotonic() < end, f"{patterns}:\n{text}"
            time.sleep(0.3)

    def close(self) -> None:
        self.lab.run(["tmux", "-S", self.socket, "kill-server"])


needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@needs_tmux
def test_the_dashboard_inside_salloc_shows_both_nodes_and_its_stop_key_ends_the_run(
        slurm_lab, tmp_path):
    code = sleeper_code(tmp_path)
    term = Terminal(slurm_lab, tmp_path, f"salloc -N 2 multihost run --launcher python "
                                         f"--nproc_per_node 2 --code {code} --no-check "
                                         f"--kill-wait 2 --log_dir {tmp_path / 'log'} -- sleeper.py")
    try:
        term.wait_for(r"│ 0 │ h1 +│ running", r"│ 1 │ h2 +│ running",
                      *(rf"h{1 + r // 2} \[{r}\]: up host=h{1 + r // 2} rank={r}" for r in range(4)),
                      r"\[s\] stop the run")
        term.keys("s")
        term.wait_for(r"stop the run on every host\? \[y\]")
        term.keys("y")
        shown = term.wait_for(r"EXIT=\d+")
    finally:
        term.close()
    assert re.search(r"run \S+ stopped on every host \(from the dashboard\)", shown), shown
    assert leftovers(slurm_lab, 2, run_id_in(shown)) == {}
    assert slurm_jobs(slurm_lab) == ""


@needs_tmux
def test_fetch_and_ssh_reach_the_nodes_of_a_run_inside_salloc_through_srun(slurm_lab, tmp_path):
    # The nodes' sshd is stopped: only srun reaches them.
    code = tmp_path / "code"
    code.mkdir()
    (code / "writer.py").write_text(
        "import os, socket, time\nos.makedirs('new')\n"
        "open('new/%s.txt' % socket.gethostname(), 'w').write('from %s\\n' % socket.gethostname())\n"
        "os.rename('new', 'out')\ntime.sleep(600)\n")
    got = tmp_path / "got"
    for i in (1, 2):
        slurm_lab.lab.sshd_stop(i)
    term = None
    try:
        term = Terminal(slurm_lab, tmp_path, (
            f"salloc -N 2 sh -c 'multihost run --launcher python --code {code} --no-check "
            f"--detach --plain --log_dir {tmp_path / 'log'} -- writer.py && "
            f"for i in $(seq 60); do multihost fetch --all out --to {got} "
            f"&& break; sleep 0.5; done; echo fetch=$?; "
            "multihost ssh h2; multihost stop >/dev/null; echo stop=$?'"))
        term.wait_for(r"fetch=0", r"root@h2:")
        term.keys("echo HOST=$(hostname) AT=$PWD SSH=$SSH_CONNECTION.; exit", "Enter")
        shown = term.wait_for(r"EXIT=\d+")
    finally:
        if term:
            term.close()
        for i in (1, 2):
            slurm_lab.lab.sshd_start(i)
    assert (got / "h2" / "out" / "h2.txt").read_text() == "from h2\n"
    assert (got / "h1" / "out" / "h1.txt").read_text() == "from h1\n"
    # A shell on h2 in the run's workdir, and no ssh login under it.
    assert re.search(r"HOST=h2 AT=/root/multihost/code SSH=\.", shown), shown
    assert "stop=0" in shown and "EXIT=0" in shown, shown
    assert leftovers(slurm_lab, 2, run_id_in(shown)) == {}


# -- the Python API ------------------------------------------------------------------------
def test_the_api_asks_slurm_for_nodes_runs_on_them_in_its_order_and_releases_them(
        slurm_lab, tmp_path):
    code = f"""
import re
import multihost

with multihost.Cluster.slurm(2) as cluster:
    print("hosts", [h.name for h in cluster.hosts], type(cluster.ssh).__name__)
    run = cluster.run(["ranks.py"], nproc_per_node=2, code={str(EXAMPLES)!r}, check=False,
                      kill_wait=2, log_dir={str(tmp_path / "log")!r})
    for line in run.lines():
        found = re.search(r"host=(h\\d) rank=(\\d)", line.text)
        if found:
            print("rank", found.group(2), found.group(1))
    print("exit", run.wait().exit_code)
"""
    done = slurm_lab.run([sys.executable, "-c", code], timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    out = done.stdout.splitlines()
    assert "hosts ['h1', 'h2'] SrunOptions" in out, done.stdout
    assert sorted(line for line in out if line.startswith("rank ")) == \
        ["rank 0 h1", "rank 1 h1", "rank 2 h2", "rank 3 h2"], done.stdout
    assert "exit 0" in out
    assert slurm_jobs(slurm_lab) == ""     # released when the block was left
