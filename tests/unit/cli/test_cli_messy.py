"""A new user's first hour (issue 11): secrets on the command line, a python without the
launcher's framework, a bad --log_dir, closed pipes, NO_COLOR, options that did nothing,
a refused run, a stop that had to SIGKILL. Each runs the real CLI as a user would, in a
sandbox HOME (test_bad_input.Sandbox); the hosts are this machine (127.0.0.1, run
locally, without ssh), so nothing here can reach a network.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_bad_input import Sandbox, assert_refused

LOCAL = ["--ips=127.0.0.1", "--python", "{python}"]
# --allow-concurrent and --start-port auto: another run or a held port on this machine is
# not what these preflights are about.
PREFLIGHT = ["--json", "--allow-concurrent", "--start-port", "auto"]


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path)


def shell_status(returncode: int) -> int:
    """What a shell reports: a death by signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def with_closed_stdout(sandbox: Sandbox, *argv: str) -> subprocess.CompletedProcess:
    """The CLI writing into a pipe whose reader is already gone (`... | head -1`, once
    head has its line), so every write fails, not just the ones after a race."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "multihost", *sandbox.expand(argv)],
                              cwd=sandbox.cwd, env=sandbox.env, stdin=subprocess.DEVNULL,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)


def save_record(sandbox: Sandbox, nprocs=(1, 1)) -> str:
    """A finished run of len(nprocs) hosts in the sandbox's HOME, as `run` records it."""
    from multihost.hosts import Host
    from multihost.run.records import NodeRecord, RunRecord, host_to_dict, record_from_dict

    run_id = "20260101-000000-abcd"
    nodes, offset = [], 0
    for rank, nproc in enumerate(nprocs):
        host = Host(name=f"127.0.0.{rank + 1}", rank=rank)
        nodes.append(NodeRecord(rank, host_to_dict(host), host.label, host.name, nproc, offset,
                                state="succeeded", exit_code=0))
        offset += nproc
    record = RunRecord(run_id, time.time(), tuple(nodes), ("train.py",), "python", "",
                       world_size=offset, state="succeeded", exit_code=0,
                       log_dir=str(sandbox.cwd / "log" / run_id))
    path = sandbox.home / ".multihost" / "runs" / run_id / "run.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dataclasses.asdict(record)))
    (sandbox.home / ".multihost" / "last").write_text(run_id + "\n")
    assert record_from_dict(json.loads(path.read_text())) == record
    return run_id


# -- secrets -------------------------------------------------------------------------------

def test_a_secret_from_the_shell_reaches_the_job_and_no_file_shows_it(sandbox: Sandbox):
    """`--env HF_TOKEN` takes the value from the controller's environment (so it is never
    in `ps`); the job gets the real values; nothing multihost writes (records, the host's
    run files, the log mirror) holds the token or a URL's password."""
    token, password = "hf_Zq8secretvalue", "pw-Xy7secret"
    url = f"postgres://app:{password}@db:5432/x"
    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()  # noqa: E731
    (sandbox.cwd / "train.py").write_text(  # the job compares digests: no secret in its code
        "import hashlib, os\n"
        "digest = lambda name: hashlib.sha256(os.environ[name].encode()).hexdigest()\n"
        f"print('token ok' if digest('HF_TOKEN') == {digest(token)!r} else 'token WRONG')\n"
        f"print('url ok' if digest('DATABASE_URL') == {digest(url)!r} else 'url WRONG')\n")
    sandbox.env["HF_TOKEN"] = token
    done = sandbox.multihost("run", "--plain", *LOCAL, "--no-check", "--launcher", "python",
                             "--env", "HF_TOKEN", "--env", f"DATABASE_URL={url}", "--",
                             "train.py", "--db", f"mysql://root:{password}@db/app", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "token ok" in done.stdout and "url ok" in done.stdout
    assert token not in done.stdout + done.stderr and password not in done.stdout + done.stderr
    record = next((sandbox.home / ".multihost" / "runs").glob("*/run.json")).read_text()
    assert "postgres://app:***@db:5432/x" in record and "mysql://root:***@db/app" in record
    for top in (sandbox.home, sandbox.cwd):
        for path in top.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert token.encode() not in data and password.encode() not in data, path


def test_a_secret_value_on_the_command_line_gets_a_note(sandbox: Sandbox):
    done = sandbox.multihost("run", "--plain", *LOCAL, "--no-check", "--launcher", "python",
                             "--env", "WANDB_API_KEY=abc123", "--", "train.py", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--env WANDB_API_KEY=... can be read by any user of this machine in `ps`" \
        in done.stderr and "abc123" not in done.stderr


# -- preflight and validation: refused before anything starts -------------------------------

def test_a_python_without_torch_is_refused_by_the_preflight_for_torchrun(sandbox: Sandbox,
                                                                         tmp_path: Path):
    """The default launcher is `python -m torch.distributed.run`: a --python without torch
    failed on every host after the start; now the preflight names the host and the fix."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    line = assert_refused(sandbox, ["run", *PREFLIGHT, "--ips=127.0.0.1", "--python", python,
                                    "--", "train.py"],
                          "127.0.0.1", "software", f"{python} has no torch",
                          "the launcher needs", "--launcher python", exit_code=3)
    assert line.startswith("multihost: 127.0.0.1: software:")
    # The python launcher imports nothing: the same interpreter is fine for it.
    done = sandbox.multihost("run", "--plain", *PREFLIGHT[1:], "--ips=127.0.0.1", "--python",
                             python, "--launcher", "python", "--", "train.py", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "training" in done.stdout


@pytest.mark.parametrize("log_dir, words", [
    ("train.py/logs", ["--log_dir train.py/logs", "not a directory"]),
    ("train.py", ["--log_dir train.py is not a directory"]),
])
def test_a_log_dir_that_cannot_be_made_is_refused_before_the_start(sandbox: Sandbox, log_dir,
                                                                    words):
    assert_refused(sandbox, ["run", *LOCAL, "--no-check", "--launcher", "python", "--log_dir",
                             log_dir, "--", "train.py"], *words, "--log_dir ./log")


def test_more_processes_than_gpus_is_refused(sandbox: Sandbox):
    assert_refused(sandbox, ["run", *LOCAL, "--gpus", "0,1", "--nproc_per_node", "4", "--",
                             "train.py"],
                   "--nproc_per_node 4", "4 processes on 2 device(s)", "--gpus 0,1")
    assert_refused(sandbox, ["check", *LOCAL, "--gpus", "0,1", "--nproc_per_node", "4"],
                   "4 processes on 2 device(s)")
    # The hostfile's gpus count too, and the host is named.
    sandbox.write({"h.ini": "[127.0.0.1]\ngpus = 0\n"})
    line = assert_refused(sandbox, ["run", "--hostfile", "{files}/h.ini", "--nproc_per_node",
                                    "2", "--", "train.py"], "hostfile's gpus")
    assert line.startswith("multihost: 127.0.0.1: --nproc_per_node 2")


def test_logs_for_a_rank_or_host_the_run_does_not_have_is_refused(sandbox: Sandbox):
    run_id = save_record(sandbox, nprocs=(1, 1))
    assert_refused(sandbox, ["logs", "--rank", "9"], "--rank 9", f"run {run_id} has no rank 9",
                   "0-1")
    assert_refused(sandbox, ["logs", "--rank", "0-7"], "no rank 2")
    assert_refused(sandbox, ["logs", "--host", "nosuch"], "--host nosuch", "no such host",
                   "127.0.0.1, 127.0.0.2")


def test_sync_takes_and_shows_only_its_own_options(sandbox: Sandbox):
    shown = sandbox.multihost("sync", "--help")
    assert shown.returncode == 0 and "--code" in shown.stdout and "--data" in shown.stdout
    for run_only in ("--gpus", "--nproc_per_node", "--start-port", "--launcher", "--env"):
        assert run_only not in shown.stdout, run_only
    assert_refused(sandbox, ["sync", *LOCAL, "--gpus", "0"],
                   "sync: unrecognized arguments: --gpus", "multihost sync --help")


# -- options that did nothing --------------------------------------------------------------

def test_exec_runs_in_its_workdir_relative_to_home(sandbox: Sandbox):
    (sandbox.home / "jobs").mkdir()
    for mode in ([], ["--plain"]):
        done = sandbox.multihost("exec", *mode, "--ips=127.0.0.1", "--workdir", "jobs", "--",
                                 "pwd")
        assert done.returncode == 0, done.stderr
        assert str(sandbox.home / "jobs") in done.stdout, done.stdout
    missing = sandbox.multihost("exec", "--ips=127.0.0.1", "--workdir", "nosuch", "--", "pwd")
    assert missing.returncode != 0 and "nosuch" in missing.stderr


# -- output: pipes and NO_COLOR ------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["check", "--ips=127.0.0.1", "--json"],
    ["exec", "--ips=127.0.0.1", "--", "seq", "1", "100000"],
    ["sync", "--ips=127.0.0.1", "--dry-run"],
], ids=["check", "exec", "sync"])
def test_a_closed_pipe_ends_the_command_quietly(sandbox: Sandbox, argv):
    done = with_closed_stdout(sandbox, *argv)
    assert shell_status(done.returncode) == 141, done.stderr
    assert done.stderr == "", done.stderr


def test_no_color_leaves_no_escape_codes_in_the_check_table(sandbox: Sandbox):
    master, slave = pty.openpty()
    env = dict(sandbox.env, NO_COLOR="1", TERM="xterm-256color", COLUMNS="200")
    proc = subprocess.Popen([sys.executable, "-m", "multihost", "check", "--ips=127.0.0.1"],
                            cwd=sandbox.cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave)
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's other side is closed: all is read
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    proc.wait(timeout=30)
    text = shown.decode("utf-8", "replace")
    assert "SOFTWARE" in text, text
    assert "\x1b" not in text, repr(text[:400])


# -- a refused run, and a stop that had to SIGKILL ------------------------------------------

STUBBORN = """\
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open("ready", "w").close()
print("ignoring SIGTERM", flush=True)
time.sleep(600)
"""


def start_stubborn(sandbox: Sandbox) -> str:
    """A detached run on this machine whose rank ignores SIGTERM; its id once it runs."""
    (sandbox.cwd / "stubborn.py").write_text(STUBBORN)
    first = sandbox.multihost(*STUBBORN_RUN, "--detach", "--", "stubborn.py", timeout=120)
    assert first.returncode == 0, first.stderr
    run_id = re.search(r"run (\S+) is running", first.stdout).group(1)
    ready = sandbox.home / "multihost" / "project" / "ready"
    deadline = time.monotonic() + 60
    while not ready.exists():
        if time.monotonic() > deadline:
            sandbox.multihost("stop", run_id, "--kill-wait", "0")
            raise AssertionError("the job never started")
        time.sleep(0.2)
    return run_id


STUBBORN_RUN = ["run", *LOCAL, "--no-check", "--launcher", "python", "--kill-wait", "1"]


def test_a_run_refused_by_a_busy_host_does_not_become_the_last_run(sandbox: Sandbox):
    run_id = start_stubborn(sandbox)
    try:
        busy = sandbox.multihost(*STUBBORN_RUN, "--plain", "--no-sync", "--", "stubborn.py",
                                 timeout=120)
        assert busy.returncode == 5, busy.stderr
        assert "busy: " in busy.stderr and f"run {run_id} (since" in busy.stderr
        # A bare status still means the run that started, not the one refused.
        status = sandbox.multihost("status", "--plain")
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith(f"run {run_id}: running"), status.stdout
    finally:
        sandbox.multihost("stop", run_id, "--kill-wait", "0")


def test_a_rank_killed_after_the_grace_of_a_stop_is_named_as_killed_by_multihost(
        sandbox: Sandbox):
    run_id = start_stubborn(sandbox)
    try:
        # `stop --json | head`: the stop happens, and the closed pipe is no traceback.
        stopped = with_closed_stdout(sandbox, "stop", "--json")
        assert shell_status(stopped.returncode) == 141 and stopped.stderr == "", stopped.stderr
        after = sandbox.multihost("status", "--plain", run_id)
        assert after.returncode == 0, after.stderr
        assert "killed by SIGKILL (multihost killed it after the --kill-wait grace: it " \
               "ignored SIGTERM)" in after.stdout, after.stdout
        assert "out of memory" not in after.stdout
    finally:
        sandbox.multihost("stop", run_id, "--kill-wait", "0")
