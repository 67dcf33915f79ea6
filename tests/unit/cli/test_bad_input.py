"""Bad input at the command line: every case runs the real CLI as a user would, and must
give exactly one line `multihost: ...` naming the cause (and the host, line or item) and
a fix, a non-zero exit, no traceback, and leave nothing behind (no run record, no log
directory, no file anywhere in HOME or the working directory).

Every host named here is a loopback address, so a case that got past the checks by
mistake could still never reach a network. The two cases that need a host use this
machine (127.0.0.1, which multihost runs locally, without ssh).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

REPO = Path(__file__).resolve().parents[3]

TRAIN = "print('training')\n"


class Sandbox:
    """A controller with its own HOME and working directory, and a directory of input
    files the cases refer to as {files}/NAME."""

    def __init__(self, root: Path):
        self.home = root / "home"
        self.cwd = root / "project"
        self.files = root / "files"
        for directory in (self.home, self.cwd, self.files):
            directory.mkdir()
        (self.cwd / "train.py").write_text(TRAIN)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("MULTIHOST_", "FLAGS_")) or k == "MULTIHOST_HOLDS_DIR"}
        self.env["HOME"] = str(self.home)
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)

    def write(self, files: Dict[str, object]) -> None:
        for name, content in files.items():
            path = self.files / name
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(str(content))

    def expand(self, argv: Sequence[str]) -> List[str]:
        return [a.replace("{files}", str(self.files)).replace("{python}", sys.executable)
                for a in argv]

    def multihost(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "multihost", *self.expand(argv)],
                              cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)

    def snapshot(self) -> List[str]:
        """Every path in HOME and the project with its content's hash, except the helper's
        bytecode cache (what a host keeps of the helper, like ssh's known_hosts: not state
        of a run)."""
        paths = []
        for top in (self.home, self.cwd):
            for path in sorted(top.rglob("*")):
                relative = path.relative_to(top.parent)
                if relative.parts[:3] in (("home", ".cache"), ("home", ".cache", "multihost")):
                    continue
                if "__pycache__" in relative.parts:
                    continue
                digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
                paths.append(f"{relative} {digest}")
        return paths


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path)


def assert_refused(sandbox: Sandbox, argv: Sequence[str], *words: str, exit_code: int = 2) -> str:
    """Run the CLI; it must refuse in one line naming each of ``words``, exit with
    ``exit_code`` (2: bad input, nothing started), and change nothing."""
    before = sandbox.snapshot()
    result = sandbox.multihost(*argv)
    shown = f"argv={list(argv)}\nstdout={result.stdout!r}\nstderr={result.stderr!r}"
    assert result.returncode == exit_code, shown
    assert "Traceback" not in result.stderr + result.stdout, shown
    lines = result.stderr.splitlines()
    assert len(lines) == 1, shown
    line = lines[0]
    assert line.startswith("multihost: "), shown
    assert "(fix: " in line and line.endswith(")"), shown
    for word in words:
        assert word in line, f"{word!r} not named\n{shown}"
    assert sandbox.snapshot() == before, f"files changed\n{shown}"
    return line


# (id, argv, input files, words the one line must contain). {files} is the sandbox's
# directory of input files.
CASES = [
    # --ips: the item is named by its position
    ("ips-empty", ["run", "--ips=", "--", "train.py"], {}, ["--ips is empty"]),
    ("ips-empty-item", ["run", "--ips=127.0.0.1,,127.0.0.2", "--", "train.py"], {},
     ["--ips item 2", "empty host name"]),
    ("ips-trailing-comma", ["run", "--ips=127.0.0.1,", "--", "train.py"], {},
     ["--ips item 2", "empty host name"]),
    ("ips-space", ["run", "--ips=127.0.0.1, 127.0.0.2", "--", "train.py"], {},
     ["--ips item 2", "white space"]),
    ("ips-port-zero", ["run", "--ips=127.0.0.1:0", "--", "train.py"], {},
     ["--ips item 1", "port '0'", "1 to 65535"]),
    ("ips-port-too-big", ["run", "--ips=127.0.0.1,127.0.0.2:65536", "--", "train.py"], {},
     ["--ips item 2", "port '65536'"]),
    ("ips-port-not-number", ["run", "--ips=127.0.0.1:ssh", "--", "train.py"], {},
     ["--ips item 1", "port 'ssh'"]),
    ("ips-duplicate", ["run", "--ips=127.0.0.1,127.0.0.2,127.0.0.1", "--", "train.py"], {},
     ["--ips item 3", "listed twice", "item 1"]),
    ("ips-duplicate-same-port", ["run", "--ips=127.0.0.1:22,127.0.0.1", "--", "train.py"], {},
     ["--ips item 2", "listed twice"]),
    ("ips-ipv6-unclosed", ["run", "--ips=[::1", "--", "train.py"], {},
     ["--ips item 1", "'[' without ']'"]),
    ("ips-ipv6-bad-address", ["run", "--ips=[::zz]:22", "--", "train.py"], {},
     ["--ips item 1", "not a valid IPv6 address"]),
    ("ips-ipv6-bad-port", ["run", "--ips=[::1]:99999", "--", "train.py"], {},
     ["--ips item 1", "port '99999'"]),
    ("ips-ipv6-junk-after-bracket", ["run", "--ips=[::1]22", "--", "train.py"], {},
     ["--ips item 1", "after ']'"]),
    ("ips-ipv6-bare-bad", ["run", "--ips=::1::2", "--", "train.py"], {},
     ["--ips item 1", "not a valid IPv6 address"]),
    ("ips-ipv4-with-two-ports", ["run", "--ips=127.0.0.1:22:23", "--", "train.py"], {},
     ["--ips item 1", "127.0.0.1:22:23"]),
    ("ips-shell-chars", ["run", "--ips=127.0.0.1;touch x", "--", "train.py"], {},
     ["--ips item 1"]),
    ("ips-option-as-host", ["run", "--ips=-oProxyCommand=id", "--", "train.py"], {},
     ["--ips item 1", "not a host name"]),
    ("ips-option-as-user", ["run", "--ips=-oProxyCommand=id@127.0.0.1", "--", "train.py"], {},
     ["--ips item 1", "not a user name"]),
    ("user-option", ["run", "--ips=127.0.0.1", "--user=-oProxyCommand=id", "--", "train.py"], {},
     ["--user", "not a user name"]),
    ("ips-and-hostfile", ["run", "--ips=127.0.0.1", "--hostfile", "{files}/h.ini", "--",
                          "train.py"], {"h.ini": "[127.0.0.2]\n"}, ["both --ips and --hostfile"]),
    # hostfiles: the file and line are named
    ("hostfile-missing", ["run", "--hostfile", "{files}/nope.ini", "--", "train.py"], {},
     ["nope.ini", "No such file"]),
    ("hostfile-unknown-key", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[defaults]\nuser = root\n[127.0.0.1]\ncolour = red\n"},
     ["h.ini:4", "unknown key 'colour'", "keys are"]),
    ("hostfile-bad-section", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[127.0.0.1]\n[127.0.0.2\n"}, ["h.ini:2", "bad section"]),
    ("hostfile-empty-section", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[]\n"}, ["h.ini:1", "bad section"]),
    ("hostfile-defaults-late", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[127.0.0.1]\n[defaults]\nuser = a\n"}, ["h.ini:2", "[defaults] must come"]),
    ("hostfile-key-outside", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "user = root\n[127.0.0.1]\n"}, ["h.ini:1", "outside any section"]),
    ("hostfile-no-equals", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[127.0.0.1]\nport 22\n"}, ["h.ini:2", "key = value"]),
    ("hostfile-bad-port", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[127.0.0.1]\nport = 70000\n"}, ["h.ini:2", "port '70000'"]),
    ("hostfile-bad-gpus", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[127.0.0.1]\ngpus = 0,one\n"}, ["h.ini:2", "gpu 'one'"]),
    ("hostfile-empty-value", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[127.0.0.1]\nworkdir =\n"}, ["h.ini:2", "workdir is empty"]),
    ("hostfile-bad-user", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[127.0.0.1]\nuser = -oProxyCommand=id\n"}, ["h.ini:2", "not a user name"]),
    ("hostfile-space-in-host", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[127.0.0.1 127.0.0.2]\n"}, ["h.ini:1", "white space", "one host per section"]),
    ("hostfile-duplicate", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "[127.0.0.1]\n[127.0.0.2]\n[127.0.0.1]\n"}, ["h.ini:3", "listed twice", "h.ini:1"]),
    ("hostfile-no-hosts", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": "# nothing yet\n[defaults]\nuser = root\n"}, ["h.ini", "no hosts"]),
    ("hostfile-not-utf8", ["run", "--hostfile", "{files}/h.ini", "--", "train.py"],
     {"h.ini": b"[127.0.0.1]\n[h\xff]\n"}, ["h.ini:2", "not UTF-8"]),
    ("workdir-empty", ["run", "--ips=127.0.0.1", "--workdir", "", "--", "train.py"], {},
     ["--workdir is empty"]),
    ("python-empty", ["run", "--ips=127.0.0.1", "--python", " ", "--", "train.py"], {},
     ["--python is empty"]),
    ("identity-missing", ["run", "--ips=127.0.0.1", "-i", "{files}/no_key", "--", "train.py"],
     {}, ["127.0.0.1:", "no_key", "does not exist"]),
    # launch templates: file and line
    ("template-unknown-variable", ["run", "--ips=127.0.0.1", "--launcher", "{files}/my.tmpl",
                                   "--", "train.py"],
     {"my.tmpl": "# mine\n{python} {program...} --port={strat_port}\n"},
     ["my.tmpl:2", "unknown variable {strat_port}", "start_port"]),
    ("template-stray-brace", ["run", "--ips=127.0.0.1", "--launcher", "{files}/my.tmpl", "--",
                              "train.py"], {"my.tmpl": "{python} {program\n"},
     ["my.tmpl:1", "stray brace"]),
    ("template-unknown-directive", ["run", "--ips=127.0.0.1", "--launcher", "{files}/my.tmpl",
                                    "--", "train.py"],
     {"my.tmpl": "@spwan node\n{python} {program...}\n"}, ["my.tmpl:1", "@spwan"]),
    ("template-list-in-word", ["run", "--ips=127.0.0.1", "--launcher", "{files}/my.tmpl", "--",
                               "train.py"], {"my.tmpl": "{python} --x={program...}\n"},
     ["my.tmpl:1", "{program...}", "stand alone"]),
    ("template-missing", ["run", "--ips=127.0.0.1", "--launcher", "torchrunn", "--", "train.py"],
     {}, ["torchrunn", "torchrun, paddle, python"]),
    # --env and --env-file
    # a bare NAME takes the value from the controller's environment; unset, it is refused
    ("env-name-not-set", ["run", "--ips=127.0.0.1", "--env", "MY_UNSET_TOKEN", "--",
                          "train.py"], {},
     ["--env MY_UNSET_TOKEN", "not set in this shell", "export MY_UNSET_TOKEN="]),
    ("env-no-name", ["run", "--ips=127.0.0.1", "--env", "=INFO", "--", "train.py"], {},
     ["--env", "'=INFO'"]),
    ("env-bad-name", ["run", "--ips=127.0.0.1", "--env", "A B=1", "--", "train.py"], {},
     ["--env", "'A B=1'"]),
    ("env-per-rank", ["run", "--ips=127.0.0.1", "--env", "RANK=3", "--", "train.py"], {},
     ["RANK", "set for each rank"]),
    ("env-reserved", ["run", "--ips=127.0.0.1", "--env", "MULTIHOST_RUN_ID=x", "--", "train.py"],
     {}, ["MULTIHOST_RUN_ID", "cannot be set by hand"]),
    ("env-devices-twice", ["run", "--ips=127.0.0.1", "--gpus", "0", "--env",
                           "CUDA_VISIBLE_DEVICES=1", "--", "train.py"], {},
     ["CUDA_VISIBLE_DEVICES and --gpus"]),
    ("env-file-bad-line", ["run", "--ips=127.0.0.1", "--env-file", "{files}/e.env", "--",
                           "train.py"], {"e.env": "# ok\nA=1\nJUST_A_NAME\n"},
     ["e.env:3", "JUST_A_NAME has no value"]),
    ("env-file-open-quote", ["run", "--ips=127.0.0.1", "--env-file", "{files}/e.env", "--",
                             "train.py"], {"e.env": "A=1\nWANDB_API_KEY=\"abc\n"},
     ["e.env:2", "never closed"]),
    ("env-file-not-utf8", ["run", "--ips=127.0.0.1", "--env-file", "{files}/e.env", "--",
                           "train.py"], {"e.env": b"A=1\nB=\xff\xfe\n"},
     ["e.env:2", "not UTF-8"]),
    ("env-file-missing", ["run", "--ips=127.0.0.1", "--env-file", "{files}/none.env", "--",
                          "train.py"], {}, ["none.env", "No such file"]),
    # the script and the job's shape
    ("no-script", ["run", "--ips=127.0.0.1"], {}, ["no script given"]),
    ("no-script-after-dashes", ["run", "--ips=127.0.0.1", "--"], {}, ["no script given"]),
    ("script-not-in-code", ["run", "--ips=127.0.0.1", "--", "tarin.py", "-c", "cfg.yml"], {},
     ["tarin.py", "not in the code directory"]),
    ("code-missing", ["run", "--ips=127.0.0.1", "--code", "no_such_dir", "--", "train.py"], {},
     ["no_such_dir", "does not exist"]),
    ("code-is-a-file", ["run", "--ips=127.0.0.1", "--code", "train.py", "--", "train.py"], {},
     ["train.py", "not a directory"]),
    ("gpus-not-index", ["run", "--ips=127.0.0.1", "--gpus", "0,x", "--", "train.py"], {},
     ["--gpus", "gpu 'x'"]),
    ("gpus-twice", ["run", "--ips=127.0.0.1", "--gpus", "0,1,0", "--", "train.py"], {},
     ["--gpus", "gpu 0 is listed twice"]),
    ("nproc-zero", ["run", "--ips=127.0.0.1", "--nproc_per_node", "0", "--", "train.py"], {},
     ["--nproc_per_node '0'"]),
    ("nproc-word", ["run", "--ips=127.0.0.1", "--nproc_per_node", "two", "--", "train.py"], {},
     ["--nproc_per_node 'two'"]),
    ("start-port-zero", ["run", "--ips=127.0.0.1", "--start-port", "0", "--", "train.py"], {},
     ["--start-port", "port '0'"]),
    ("start-port-word", ["run", "--ips=127.0.0.1", "--start-port", "high", "--", "train.py"], {},
     ["--start-port", "port 'high'"]),
    ("start-port-no-room", ["run", "--ips=127.0.0.1", "--nproc_per_node", "4", "--start-port",
                            "65533", "--", "train.py"], {},
     ["start port 65533", "4 trainer port(s)", "127.0.0.1"]),
    ("port-zero", ["run", "--ips=127.0.0.1", "--port", "0", "--", "train.py"], {},
     ["--port", "port '0'"]),
    ("kill-wait-negative", ["run", "--ips=127.0.0.1", "--kill-wait", "-1", "--", "train.py"], {},
     ["--kill-wait"]),
    ("kill-wait-word", ["run", "--ips=127.0.0.1", "--kill-wait", "soon", "--", "train.py"], {},
     ["--kill-wait", "'soon'", "multihost run --help"]),
    ("wait-negative", ["run", "--ips=127.0.0.1", "--wait", "-5", "--", "train.py"], {},
     ["--wait"]),
    ("fanout-zero", ["run", "--ips=127.0.0.1", "--fanout", "0", "--", "train.py"], {},
     ["--fanout '0'"]),
    ("connect-timeout-negative", ["run", "--ips=127.0.0.1", "--connect-timeout", "-1", "--",
                                  "train.py"], {}, ["--connect-timeout '-1'"]),
    ("plain-and-json", ["run", "--ips=127.0.0.1", "--plain", "--json", "--", "train.py"], {},
     ["--plain", "--json"]),
    # `--gpu` is not taken for `--gpus`: no flag is guessed from a prefix
    ("unknown-flag", ["run", "--ips=127.0.0.1", "--gpu", "0", "--", "train.py"], {},
     ["run: unrecognized arguments: --gpu", "multihost run --help"]),
    ("unknown-command", ["launch", "--ips=127.0.0.1"], {}, ["'launch'", "multihost --help"]),
    ("check-bad-ips", ["check", "--ips=127.0.0.1,,"], {}, ["--ips item 2"]),
    ("exec-no-command", ["exec", "--ips=127.0.0.1"], {}, ["no command given"]),
    # logs, status, stop: the run id and the filters
    ("logs-no-run-yet", ["logs"], {}, ["no run has been started"]),
    ("logs-unknown-run", ["logs", "20990101-000000-abcd"], {}, ["20990101-000000-abcd"]),
    ("status-unknown-run", ["status", "nosuch"], {}, ["no run 'nosuch'", "status --list"]),
    ("status-json-unknown-run", ["status", "--json", "nosuch"], {}, ["no run 'nosuch'"]),
    ("stop-unknown-run", ["stop", "../../etc"], {}, ["no run '../../etc'"]),
    ("logs-since-word", ["logs", "--since", "yesterday"], {}, ["--since 'yesterday'", "15m"]),
    ("logs-since-negative", ["logs", "--since=-5m"], {}, ["--since '-5m'"]),
    ("logs-rank-word", ["logs", "--rank", "zero"], {}, ["--rank 'zero'"]),
    ("logs-rank-backwards", ["logs", "--rank", "7-0"], {}, ["--rank '7-0'", "backwards"]),
    ("logs-rank-huge", ["logs", "--rank", "0-99999999999"], {}, ["99999999999"]),
    ("logs-grep-bad-regex", ["logs", "--grep", "loss=("], {}, ["--grep 'loss=('", "regex"]),
    ("logs-tail-negative", ["logs", "--tail", "-1"], {}, ["--tail"]),
]


@pytest.mark.parametrize("argv,files,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_in_one_line(sandbox: Sandbox, argv, files, words):
    sandbox.write(files)
    assert_refused(sandbox, argv, *words)


def test_cases_are_many_and_distinct():
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names))
    assert len(names) >= 30


def test_a_bad_control_persist_setting_is_refused(sandbox: Sandbox):
    sandbox.env["MULTIHOST_CONTROL_PERSIST"] = "10m"
    assert_refused(sandbox, ["sync", "--ips=127.0.0.1"], "MULTIHOST_CONTROL_PERSIST='10m'",
                   "seconds")


@pytest.mark.parametrize("name,value", [("MULTIHOST_LOST_AFTER", "15s"),
                                        ("MULTIHOST_HELPER_START", "0")])
def test_a_bad_wait_setting_is_refused(sandbox: Sandbox, name, value):
    sandbox.env[name] = value
    assert_refused(sandbox, ["sync", "--ips=127.0.0.1"], f"{name}={value!r}", "seconds")


# -- cases that need a host: this machine, run locally (no ssh) -----------------------------

def test_gpus_the_host_does_not_have(sandbox: Sandbox):
    # No machine has 64 devices: the preflight refuses before anything is started.
    # --allow-concurrent: another run on this machine is not what this test is about.
    # --start-port auto: nor is a port another test holds. --json: no progress lines.
    line = assert_refused(sandbox, ["run", "--json", "--ips=127.0.0.1", "--allow-concurrent",
                                    "--start-port", "auto", "--gpus", "63", "--launcher", "python", "--python",
                                    "{python}", "--", "train.py"], "127.0.0.1", "gpus", "63",
                          exit_code=3)
    assert line.startswith("multihost: 127.0.0.1: gpus:")


def test_unknown_run_when_runs_exist(sandbox: Sandbox):
    """With a real run recorded, a wrong id still names itself and changes nothing (it
    is not taken for the last run), and the real run's record is left as it was."""
    done = sandbox.multihost("run", "--plain", "--ips=127.0.0.1", "--no-check", "--launcher",
                             "python", "--python", "{python}", "--", "train.py", timeout=120)
    assert done.returncode == 0, done.stderr
    records = list((sandbox.home / ".multihost" / "runs").glob("*/run.json"))
    assert len(records) == 1
    record = records[0].read_bytes()
    for command in ("status", "stop", "logs"):
        assert_refused(sandbox, [command, "20990101"], "no run '20990101'")
    assert_refused(sandbox, ["logs", "--rank", "3-1"], "backwards")
    assert records[0].read_bytes() == record


def test_a_relative_workdir_is_under_home_on_this_machine_too(sandbox: Sandbox):
    """Like ssh (and the sync), a relative --workdir is relative to HOME, also for the
    host that is this machine, where multihost runs in the controller's directory."""
    done = sandbox.multihost("run", "--plain", "--ips=127.0.0.1", "--no-check", "--workdir",
                             "jobs/my run", "--launcher", "python", "--python", "{python}",
                             "--", "train.py", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "training" in done.stdout
    assert (sandbox.home / "jobs" / "my run" / "train.py").read_text() == TRAIN
    assert not (sandbox.cwd / "jobs").exists()


def test_a_port_where_no_ssh_server_answers_is_one_line(sandbox: Sandbox):
    """Something on loopback accepts and hangs up (a wrong --port): one line naming the
    host and the fix, and none of paramiko's own tracebacks from its thread."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]

    def hang_up():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        assert_refused(sandbox, ["exec", f"--ips=127.0.0.1:{port}", "--", "true"],
                       f"127.0.0.1:{port}", "ssh", exit_code=255)
    finally:
        server.close()
