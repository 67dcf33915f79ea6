"""The lab itself, end to end: real sshd per host, private hosts, faults, teardown."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from multihost.errors import LabError
from multihost.lab import Lab
from multihost.lab import procs


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    """`multihost ...` run plainly on this machine (not as the controller)."""
    return subprocess.run([sys.executable, "-m", "multihost", *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=120, **kw)


def test_every_host_answers_real_openssh(lab):
    with ThreadPoolExecutor(lab.n) as pool:
        results = list(pool.map(lambda i: lab.ssh(i, "hostname"), range(1, lab.n + 1)))
    for i, r in enumerate(results, 1):
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"h{i}"


def test_status_and_hostfile(lab):
    rows = lab.lab.status()
    assert [(h.name, h.address, h.sshd, h.link) for h in rows] == [
        (f"h{i}", f"198.18.0.{10 + i}", True, True) for i in range(1, lab.n + 1)]
    assert all(h.pid for h in rows)
    text = lab.hostfile.read_text()
    assert text.splitlines()[:5] == ["# written by `multihost lab up`", "[defaults]", "user = root",
                                     f"python = {sys.executable}", "workdir = /root/work"]
    assert text.splitlines()[5:] == [f"[198.18.0.{10 + i}]" for i in range(1, lab.n + 1)]


def test_controller_environment(lab):
    """`lab exec`: HOME and the passwd ~/.ssh are the lab's (pitfall 2), names resolve."""
    r = lab.run(["sh", "-c", 'echo "$HOME|$MULTIHOST_LAB_DIR"; '
                 'cat "$(getent passwd "$(id -u)" | cut -d: -f6)/.ssh/config"; '
                 "getent hosts h3 ctl"], check=True)
    lines = r.stdout.splitlines()
    assert lines[0] == f"{lab.home}|{lab.dir}"
    assert f"IdentityFile {lab.home}/.ssh/id_ed25519" in r.stdout
    assert "198.18.0.13" in r.stdout and "198.18.0.1 " in r.stdout
    # paramiko reads $HOME: the lab's key and known_hosts, strict host key checking.
    code = ("import paramiko; c = paramiko.SSHClient(); c.load_system_host_keys(); "
            "c.set_missing_host_key_policy(paramiko.RejectPolicy()); c.connect('198.18.0.12'); "
            "print(c.exec_command('hostname')[1].read().decode().strip())")
    r = lab.run([sys.executable, "-c", code])
    assert (r.returncode, r.stdout.strip()) == (0, "h2"), r.stderr


def test_hosts_are_private_machines(lab):
    token = secrets.token_hex(4)
    path = f"/tmp/lab-test-{token}"
    assert lab.ssh(1, f"echo {token} > {path} && echo hi > ~/note-{token}").returncode == 0
    assert lab.host_run(1, ["cat", path]).stdout.strip() == token
    assert lab.host_run(2, ["test", "-e", path]).returncode == 1   # private /tmp
    assert lab.host_run(2, ["test", "-e", f"/root/note-{token}"]).returncode == 1  # private /root
    assert not os.path.exists(path)                                 # not the machine's /tmp
    r = lab.host_run(2, ["sh", "-c", "hostname; tr '\\0' ' ' </proc/1/cmdline; echo; "
                                     "grep -c 127.0.1.1 /etc/hosts || true"])
    name, init, no_loopback_name = r.stdout.splitlines()
    assert name == "h2" and "init.py" in init and no_loopback_name == "0"


def test_hosts_run_the_controller_python(lab):
    """The venv and the interpreter it links to are shared into every host (pitfall 3)."""
    r = lab.ssh(3, f"{sys.executable} -c 'import multihost, sys; print(sys.prefix)'")
    assert (r.returncode, r.stdout.strip()) == (0, sys.prefix), r.stderr


def test_hosts_reach_each_other(lab):
    r = lab.ssh(1, "ping -c1 -W2 h2 >/dev/null && ssh -o BatchMode=yes h3 hostname "
                   "&& ssh -o BatchMode=yes 198.18.0.14 hostname")
    assert (r.returncode, r.stdout.split()) == (0, ["h3", "h4"]), r.stderr
    assert lab.host_run(4, ["ping", "-c1", "-W2", "198.18.0.11"]).returncode == 0


def test_cut_host_times_out_heal_restores(lab):
    with lab.cut_link(2):
        t0 = time.monotonic()
        r = lab.ssh(2, "true", connect_timeout=2)
        took = time.monotonic() - t0
        assert r.returncode == 255 and "timed out" in r.stderr, r.stderr
        assert took >= 1.9
        assert lab.ssh(1, "hostname").stdout.strip() == "h1"
        assert [h.link for h in lab.lab.status()] == [True, False, True, True]
        r = lab.multihost("lab", "status")  # MULTIHOST_LAB_DIR finds this lab
        assert r.returncode == 0 and "cut" in r.stdout.splitlines()[3], r.stdout + r.stderr
    assert lab.ssh(2, "hostname").stdout.strip() == "h2"


def test_sshd_stop_leaves_host_and_sessions_alive(lab):
    r = lab.ssh(3, "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!")
    pid = r.stdout.strip()
    assert r.returncode == 0 and pid.isdigit(), r.stderr
    session = lab.popen(["ssh", "-o", "BatchMode=yes", lab.address(3), "sleep 1; echo still here"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)  # let the session open before its sshd dies
    try:
        with lab.sshd_stopped(3):
            r = lab.ssh(3, "true")
            assert r.returncode == 255 and "refused" in r.stderr, r.stderr
            assert lab.host_run(3, ["kill", "-0", pid]).returncode == 0
            assert [h.sshd for h in lab.lab.status()] == [True, True, False, True]
            out, err = session.communicate(timeout=30)
            assert (session.returncode, out.strip()) == (0, "still here"), err
        assert lab.ssh(3, "hostname").stdout.strip() == "h3"
        assert lab.host_run(3, ["kill", "-0", pid]).returncode == 0
    finally:
        lab.host_run(3, ["kill", pid])
        if session.poll() is None:
            session.kill()


def test_cli_exec_and_host(lab):
    r = _cli("lab", "exec", "--name", lab.name, "--", "ssh", lab.address(1), "hostname")
    assert (r.returncode, r.stdout.strip()) == (0, "h1"), r.stderr
    r = _cli("lab", "host", "4", "--name", lab.name, "--", "sh", "-c", "hostname; exit 3")
    assert (r.returncode, r.stdout.strip()) == (3, "h4"), r.stderr
    r = _cli("lab", "cut", "9", "--name", lab.name)
    assert r.returncode == 1 and r.stderr.startswith("multihost: lab ") and "fix:" in r.stderr


def test_up_refuses_an_existing_lab(lab):
    with pytest.raises(LabError, match="already exists"):
        Lab(lab.name).up(1)
    assert lab.ssh(1, "true").returncode == 0  # and left it alone


def _leftovers(name: str, path: Path) -> list:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    with open("/proc/mounts") as f:
        mounts = [line for line in f if str(path) in line]
    return ([line for line in ns.splitlines() if line.split()[0].startswith(name + "-")]
            + mounts + ([str(path)] if path.exists() else []))


def test_second_lab_coexists_and_down_leaves_nothing(lab, tmp_path):
    name = "mht" + secrets.token_hex(2)
    path = tmp_path / "lab2"
    try:
        r = _cli("lab", "up", "1", "--name", name, "--dir", str(path), "--rate", "1gbit")
        assert r.returncode == 0, r.stderr
        second = Lab(name, path)
        init = json.loads((path / "lab.json").read_text())["inits"]["1"]
        # Same address as the first lab's h1, but its own switch: h1 of *this* lab answers.
        r = subprocess.run(second.exec_argv(["ssh", "198.18.0.11", "hostname"]),
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout.strip()) == (0, "h1"), r.stderr
        qdisc = subprocess.run(["tc", "-n", f"{name}-h1", "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "rate 1Gbit" in qdisc
        assert _cli("lab", "down", "--dir", str(path)).returncode == 0
        assert _leftovers(name, path) == []
        assert not procs.alive(procs.Proc(*init))
        assert _cli("lab", "down", "--dir", str(path)).returncode == 0  # idempotent
        # A half-built lab (a namespace and nothing else) comes down too.
        subprocess.run(["ip", "netns", "add", f"{name}-h1"], check=True)
        Lab(name, path).down()
        assert _leftovers(name, path) == []
    finally:
        Lab(name, path).down()
    assert lab.ssh(1, "hostname").stdout.strip() == "h1"  # the first lab is untouched
