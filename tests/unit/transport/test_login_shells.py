"""Every line multihost sends reaches `sh` unchanged, whatever the account's login shell:
sshd runs `SHELL -c LINE`, and tcsh, fish and zsh each read quotes their own way."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess

import pytest

from multihost.transport.base import START, kill_group_line, remote_line, split_start
from multihost.remote.sync.relay import any_login_shell

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
SHELLS = ["bash", "dash", "zsh", "tcsh", "fish"]
LINES = [
    "echo plain",
    "printf '%s\\n' 'single quotes' \"double\" back\\\\slash",
    "echo 'history!' \"$HOME\" | tr a-z A-Z",
    "printf 'a\\nb\\n'\nprintf 'two lines\\n'",
    "echo " + shlex.quote(json.dumps({"op": "x", "path": "it's a \\ \"name\"!", "n": [1, 2]})),
]


def as_login_shell(shell: str, line: str) -> subprocess.CompletedProcess:
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} is not installed (scripts/setup.sh installs it)")
    return subprocess.run([path, "-c", line], capture_output=True, timeout=30, env=ENV)


@pytest.mark.parametrize("shell", SHELLS)
def test_every_line_runs_under_sh_whatever_the_login_shell(shell):
    for line in LINES:
        expected = subprocess.run(["sh", "-c", line], capture_output=True, timeout=30, env=ENV)
        got = as_login_shell(shell, remote_line(line))
        pid, found, stderr = split_start(got.stderr)
        assert found and pid, (shell, line, got.stderr)
        assert got.stdout == expected.stdout and got.returncode == 0, (shell, line, got)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_start_marker_names_the_login_shells_own_pid(shell):
    # exec: sh takes the login shell's place, so its pid leads the command's group
    got = as_login_shell(shell, remote_line("echo $$"))
    pid, found, _ = split_start(got.stderr)
    assert found and str(pid) == got.stdout.decode().strip()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_relay_hop_line_reaches_sh_whatever_the_next_hosts_shell(shell):
    line = "printf '%s\\n' \"$0\" 'it'\"'\"'s'"
    got = as_login_shell(shell, any_login_shell(line))
    assert got.stdout == b"sh\nit's\n", got


def test_a_plain_line_travels_as_it_is():
    line = remote_line("cd /srv && ls -la")
    assert line == f"exec sh -c 'echo >&2; echo {START.decode()} $$ >&2; cd /srv && ls -la'"


def live_in_group(pgid: int) -> list:
    """The processes of group ``pgid`` that still run (a zombie is not running)."""
    table = subprocess.run(["ps", "-eo", "pgid=,stat=,args="], capture_output=True,
                           text=True).stdout
    return [line for line in table.splitlines()
            if line.split()[0] == str(pgid) and not line.split()[1].startswith("Z")]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_command_given_up_on_has_its_whole_group_ended_whatever_the_login_shell(shell):
    victim = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300; wait"], start_new_session=True)
    try:
        ended = as_login_shell(shell, remote_line(kill_group_line(victim.pid)))
        assert ended.returncode == 0, ended
        assert victim.wait(timeout=10) != 0   # the group's leader, and its child with it
        assert not live_in_group(victim.pid)
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, 9)
            victim.wait()
