"""`multihost check` as a user runs it, on this machine alone (no ssh): the helper is
installed into a fresh home on first use, and a port this test holds is reported busy."""
import json
import os
import socket
import subprocess
import sys

import pytest


def multihost(home, *args):
    env = dict(os.environ, HOME=str(home))
    return subprocess.run([sys.executable, "-m", "multihost", *args], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.fixture
def server():
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_json_report_of_this_machine(tmp_path):
    done = multihost(tmp_path, "check", "--json", "--start-port", "auto")
    assert done.returncode in (0, 3), done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is (done.returncode == 0)
    assert 10000 <= doc["start_port"] <= 20000 and doc["auto_port"] is True
    host = doc["hosts"][0]
    assert host["rank"] == 0 and host["host"] == "127.0.0.1"
    checks = {c["name"]: c for c in host["checks"]}
    assert checks["ssh"]["status"] == "pass" and checks["ports"]["status"] == "pass"
    assert checks["rendezvous"]["detail"].startswith(f"listening on :{doc['start_port']}")
    assert any(p.name.startswith("helper-") for p in (tmp_path / ".cache" / "multihost").iterdir())


def test_a_port_held_here_fails_the_check(tmp_path, server):
    done = multihost(tmp_path, "check", "--start-port", str(server))
    assert done.returncode == 3
    assert f"ports: port {server} is in use by pid {os.getpid()}" in done.stdout
    assert "--start-port auto" in done.stdout  # the fix
    assert done.stdout.rstrip().splitlines()[-1].startswith("NOT ready")


def test_bad_flags_are_one_line(tmp_path):
    done = multihost(tmp_path, "check", "--nproc_per_node", "zero")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--nproc_per_node" in done.stderr and "Traceback" not in done.stderr
