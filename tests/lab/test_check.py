"""`multihost check` end to end in the lab: real sshd, real sockets, real links.

The issue's acceptance list: every check passing; a cut host; a host whose sshd refuses
the key; a busy port on one host (a listener the test starts there); a host whose python
lacks torch; --start-port auto choosing around a busy port; the N x N ping matrix when one
host's link is down; and more a user would meet: a busy master port, a hostname on
loopback, leftovers of an earlier run. Everything a test changes on a host is undone.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator

# A listener held until the test closes its stdin: it ends itself, nothing to kill.
LISTEN = ("import socket, sys; s = socket.socket(); "
          "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
          "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); print('up', flush=True); "
          "sys.stdin.read()")
# A process of an "earlier run", held the same way.
LEFTOVER = "import sys; print('up', flush=True); sys.stdin.read()"
RUN_ID = "20261121-101500-3f2a"


def check(lab, *args, hostfile=None, timeout=120):
    done = lab.multihost("check", "--hostfile", str(hostfile or lab.hostfile), "--json", *args,
                         timeout=timeout)
    assert done.stdout, done.stderr
    return done, json.loads(done.stdout)


def by_name(doc: dict, rank: int) -> Dict[str, dict]:
    return {c["name"]: c for c in doc["hosts"][rank]["checks"]}


def statuses(doc: dict, name: str):
    return [by_name(doc, h["rank"])[name]["status"] for h in doc["hosts"]]


# The same as a shell builtin, for another user (who may not reach this python).
LEFTOVER_SH = ["sh", "-c", "echo up; read line"]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@contextlib.contextmanager
def on_host(lab, i: int, code: str, *args: str, env: Dict[str, str] = None,
            argv=None) -> Iterator[int]:
    """Run python code (or ``argv``) inside host i until the block ends (its stdin is
    closed then)."""
    argv = list(argv or [sys.executable, "-c", code, *args])
    if env:
        argv = ["env", *[f"{k}={v}" for k, v in env.items()], *argv]
    proc = subprocess.Popen(lab.lab.host_argv(i, argv), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert proc.stdout.readline().strip() == "up"
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_every_check_passes_on_a_healthy_lab(lab):
    started = time.monotonic()
    done, doc = check(lab)
    assert done.returncode == 0 and doc["ok"] is True, done.stdout
    assert time.monotonic() - started < 30
    assert [(h["rank"], h["address"], h["iface"]) for h in doc["hosts"]] == \
        [(i, lab.address(i + 1), "eth0") for i in range(lab.n)]
    for rank in range(lab.n):
        assert {c["status"] for c in doc["hosts"][rank]["checks"]} == {"pass"}
    assert by_name(doc, 0)["rendezvous"]["detail"] == \
        f"listening on :17000; {lab.n - 1}/{lab.n - 1} hosts connected"
    assert by_name(doc, 1)["software"]["detail"].startswith("Python 3.")
    assert "torch" in by_name(doc, 1)["software"]["detail"]
    assert doc["master_addr"] == lab.address(1)


def test_plain_output_in_a_pipe_folds_identical_hosts(lab):
    done = lab.multihost("check", "--hostfile", str(lab.hostfile))
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["RANK", "HOST"]
    assert lines[2].split()[:2] == ["1-3", "198.18.0.[12-14]"]
    assert lines[-1].startswith("ready: 4 hosts, start port 17000")


def test_a_cut_host_is_marked_without_holding_the_others(lab):
    with lab.cut_link(3):
        started = time.monotonic()
        done, doc = check(lab, "--connect-timeout", "2")
        elapsed = time.monotonic() - started
    assert done.returncode == 3 and doc["ok"] is False
    # Not held by the cut host: a wait on its TCP connect would take minutes (the
    # kernel's SYN retries), the check's own waits (--connect-timeout 2, the probes'
    # budget) some seconds, more on a machine busy with other work.
    assert elapsed < 60, f"the report took {elapsed:.1f}s"
    cut = by_name(doc, 2)
    assert cut["reach"]["status"] == "fail" and cut["ssh"]["status"] == "fail"
    assert "198.18.0.13:22" in cut["ssh"]["detail"]
    assert cut["software"]["status"] == "skip"
    # The others answered in full, and none of them hears the cut host.
    for rank in (0, 1, 3):
        assert by_name(doc, rank)["software"]["status"] == "pass"
        assert by_name(doc, rank)["ping"]["detail"].startswith("no echo from 198.18.0.13")
    rtt = doc["ping_matrix"]["rtt_ms"]
    assert rtt[2] is None and [row[2] for i, row in enumerate(rtt) if i != 2] == [None] * 3
    assert all(row[j] is not None for i, row in enumerate(rtt) if row for j in (0, 1, 3) if i != j)


def test_the_ping_matrix_is_printed_when_a_link_is_down(lab):
    with lab.cut_link(2):
        done = lab.multihost("check", "--hostfile", str(lab.hostfile), "--connect-timeout", "2")
    assert done.returncode == 3
    text = done.stdout
    matrix = text[text.index("ping matrix"):].splitlines()
    assert matrix[2].split() == ["198.18.0.11", "0", ".", "X", "ok", "ok"]
    assert matrix[3].split() == ["198.18.0.12", "1", "?", ".", "?", "?"]
    assert "FAIL 198.18.0.[11,13-14]: ping: no echo from 198.18.0.12" in text


@contextlib.contextmanager
def key_refused(lab, i: int) -> Iterator[None]:
    keys = "/root/.ssh/authorized_keys"
    lab.host_run(i, ["mv", keys, keys + ".off"], check=True)
    try:
        yield
    finally:
        lab.host_run(i, ["mv", keys + ".off", keys], check=True)


def test_a_host_that_refuses_the_key(lab):
    with key_refused(lab, 2):
        done, doc = check(lab)
    assert done.returncode == 3
    ssh = by_name(doc, 1)["ssh"]
    assert ssh["status"] == "fail" and "rejected our key" in ssh["detail"]
    assert "ssh-copy-id root@198.18.0.12" in ssh["fix"]
    assert by_name(doc, 1)["reach"]["status"] == "pass"  # the host is up
    assert statuses(doc, "ssh") == ["pass", "fail", "pass", "pass"]


def test_a_busy_port_on_one_host_names_the_process(lab):
    with on_host(lab, 2, LISTEN, "17001"):
        done, doc = check(lab)
    assert done.returncode == 3
    assert statuses(doc, "ports") == ["pass", "fail", "pass", "pass"]
    ports = by_name(doc, 1)["ports"]
    assert ports["detail"].startswith("port 17001 is in use by pid ")
    assert "import socket" in ports["detail"] and "--start-port auto" in ports["fix"]


def test_a_busy_master_port_on_the_first_host(lab):
    with on_host(lab, 1, LISTEN, "17000"):
        done, doc = check(lab)
    assert done.returncode == 3
    assert by_name(doc, 0)["ports"]["status"] == "fail"
    assert by_name(doc, 0)["rendezvous"]["status"] == "fail"
    assert statuses(doc, "rendezvous")[1:] == ["skip"] * 3


def test_start_port_auto_goes_around_a_busy_port(lab):
    with on_host(lab, 3, LISTEN, "10000"):
        done, doc = check(lab, "--start-port", "auto")
    assert done.returncode == 0, done.stdout
    assert doc["start_port"] == 10001 and doc["auto_port"] is True
    assert by_name(doc, 2)["ports"]["detail"].startswith("10001-10002 free (auto")
    assert by_name(doc, 0)["rendezvous"]["detail"].startswith("listening on :10001; 3/3")


def test_a_host_whose_python_lacks_torch(lab, tmp_path):
    text = Path(lab.hostfile).read_text().replace(
        f"[{lab.address(4)}]", f"[{lab.address(4)}]\npython = /usr/bin/python3")
    hostfile = tmp_path / "hosts.ini"
    hostfile.write_text(text)
    done, doc = check(lab, hostfile=hostfile)
    assert done.returncode == 3
    assert statuses(doc, "software") == ["pass", "pass", "pass", "fail"]
    software = by_name(doc, 3)["software"]
    assert software["detail"].startswith("/usr/bin/python3") and "has no torch" in software["detail"]
    assert "198.18.0.[11-13]" in software["detail"]
    assert "torch==" in software["fix"]


@contextlib.contextmanager
def hostname_on_loopback(lab, name: str) -> Iterator[None]:
    """Debian's `127.0.1.1 <hostname>` line, first in the lab's shared /etc/hosts."""
    path = Path(lab.dir) / "etc" / "hosts"
    original = path.read_text()
    with open(path, "r+") as f:  # in place: the hosts see this file through bind mounts
        f.write(f"127.0.1.1\t{name}\n" + original)
    try:
        yield
    finally:
        with open(path, "r+") as f:
            f.write(original)
            f.truncate()


def test_a_hostname_on_loopback_warns_with_the_fix(lab):
    with hostname_on_loopback(lab, "h2"):
        done, doc = check(lab)
    assert done.returncode == 0  # a warning: run sets GLOO_SOCKET_IFNAME itself
    iface = by_name(doc, 1)["iface"]
    assert iface["status"] == "warn" and "resolves to 127.0.1.1" in iface["detail"]
    assert "GLOO_SOCKET_IFNAME=eth0" in iface["fix"]
    assert statuses(doc, "iface") == ["pass", "warn", "pass", "pass"]


@contextlib.contextmanager
def run_recorded_here(lab, run_id: str) -> Iterator[None]:
    """A record of ``run_id`` on the controller: a run this controller started."""
    record = Path(lab.home) / ".multihost" / "runs" / run_id / "run.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("{}\n")
    try:
        yield
    finally:
        record.unlink()
        record.parent.rmdir()


def test_leftovers_of_an_earlier_run(lab):
    with run_recorded_here(lab, RUN_ID), \
            on_host(lab, 4, LEFTOVER, env={"MULTIHOST_RUN_ID": RUN_ID}) as _:
        done, doc = check(lab)
    assert done.returncode == 3
    assert statuses(doc, "leftovers") == ["pass", "pass", "pass", "fail"]
    leftovers = by_name(doc, 3)["leftovers"]
    assert leftovers["detail"].startswith(f"run {RUN_ID} still has 1 process here")
    assert leftovers["fix"].startswith(f"stop it: run `multihost stop {RUN_ID}`")


def test_leftovers_are_the_users_own_and_a_run_unknown_here_says_so(lab):
    # Host 3: another user's job carries a run marker: none of this user's business.
    # Host 4: this user's process of a run this controller has no record of.
    marker = {"MULTIHOST_RUN_ID": RUN_ID}
    with on_host(lab, 3, "", env=marker, argv=NOBODY + LEFTOVER_SH), \
            on_host(lab, 4, "", env=marker, argv=LEFTOVER_SH) as _:
        done, doc = check(lab)
    assert done.returncode == 3
    assert statuses(doc, "leftovers") == ["pass", "pass", "pass", "fail"]
    leftovers = by_name(doc, 3)["leftovers"]
    assert leftovers["detail"].startswith(
        f"run {RUN_ID}, not started from this controller, still has 1 process here")
    assert leftovers["fix"].startswith("stop it here: run `multihost exec --hostfile ")
    assert f"`multihost stop {RUN_ID}` on the controller that started it" in leftovers["fix"]


# The lab's sshd listens on the host's first address only: this relays the second
# address's ssh port to it, until the test closes its stdin.
RELAY = """
import socket, sys, threading
listen, target = (sys.argv[1], 22), (sys.argv[2], 22)
def pump(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
def serve(server):
    while True:
        client, _ = server.accept()
        upstream = socket.create_connection(target)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(listen)
server.listen(16)
threading.Thread(target=serve, args=(server,), daemon=True).start()
print("up", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def second_address(lab, i: int, address: str) -> Iterator[None]:
    """Host i also answers on ``address`` (its eth0 holds both, its sshd is reached
    there through a relay), known to the controller's ssh as host i."""
    lab.host_run(i, ["ip", "addr", "add", f"{address}/24", "dev", "eth0"], check=True)
    known_hosts = Path(lab.home) / ".ssh" / "known_hosts"
    original = known_hosts.read_text()
    keys = [line.split(None, 1)[1] for line in original.splitlines()
            if lab.address(i) in line.split(None, 1)[0].split(",")]
    known_hosts.write_text(original + "".join(f"{address} {key}\n" for key in keys))
    try:
        with on_host(lab, i, RELAY, address, lab.address(i)):
            yield
    finally:
        known_hosts.write_text(original)
        lab.host_run(i, ["ip", "addr", "del", f"{address}/24", "dev", "eth0"], check=True)


def test_the_same_machine_under_two_addresses_is_named_once_with_the_fix(lab, tmp_path):
    hostfile = tmp_path / "hosts.ini"
    hostfile.write_text(Path(lab.hostfile).read_text() + "\n[198.18.0.99]\n")
    with second_address(lab, 2, "198.18.0.99"):
        done, doc = check(lab, hostfile=hostfile)
    assert done.returncode == 3, done.stdout
    assert [("machine" in by_name(doc, h["rank"])) for h in doc["hosts"]] == \
        [False, False, False, False, True], json.dumps(doc["hosts"][4], indent=1)
    machine = by_name(doc, 4)["machine"]
    assert machine["status"] == "fail"
    assert machine["detail"].startswith(f"198.18.0.99 is the same machine as {lab.address(2)} "
                                        "(rank 1)")
    assert "list each machine once: add `--exclude 198.18.0.99`" in machine["fix"]
    assert by_name(doc, 4)["ports"]["status"] == "skip"  # not "in use by multihost"


SLOW_PYTHON = """#!/bin/sh
# A python that takes forever to start (an overloaded host), until the test lets it go.
while [ ! -e /root/slowpy.go ]; do sleep 0.1; done
exec {python} "$@"
"""


@contextlib.contextmanager
def slow_python(lab, i: int) -> Iterator[str]:
    lab.host_run(i, ["sh", "-c", "cat > /root/slowpy && chmod +x /root/slowpy"],
                 input=SLOW_PYTHON.format(python=sys.executable), check=True)
    try:
        yield "/root/slowpy"
    finally:
        lab.host_run(i, ["touch", "/root/slowpy.go"], check=True)
        time.sleep(0.5)  # the stalled helper runs its (short) course
        lab.host_run(i, ["rm", "-f", "/root/slowpy", "/root/slowpy.go"], check=True)


def test_a_slow_host_is_marked_and_does_not_hold_the_report(lab, tmp_path):
    with slow_python(lab, 3) as python:
        text = Path(lab.hostfile).read_text().replace(
            f"[{lab.address(3)}]", f"[{lab.address(3)}]\npython = {python}")
        hostfile = tmp_path / "hosts.ini"
        hostfile.write_text(text)
        started = time.monotonic()
        done, doc = check(lab, "--timeout", "1", hostfile=hostfile)
        elapsed = time.monotonic() - started
    # The stalled python never answers: held by it, the report would never come.
    assert done.returncode == 3 and elapsed < 60, f"{elapsed:.1f}s"
    software = by_name(doc, 2)["software"]
    assert software["status"] == "fail"
    assert software["detail"].startswith("the checks did not answer within 8s")
    assert statuses(doc, "software") == ["pass", "pass", "fail", "pass"]
    assert statuses(doc, "rendezvous") == ["pass", "pass", "skip", "pass"]


def test_a_workdir_of_that_hosts_own_ssh_directory_names_that_host(lab, tmp_path):
    hostfile = tmp_path / "hosts.ini"
    hostfile.write_text(Path(lab.hostfile).read_text().replace(
        f"[{lab.address(3)}]", f"[{lab.address(3)}]\nworkdir = ~/.ssh/"))
    done, doc = check(lab, hostfile=hostfile)
    assert done.returncode == 3
    assert ["workdir" in by_name(doc, h["rank"]) for h in doc["hosts"]] == \
        [False, False, True, False]
    workdir = by_name(doc, 2)["workdir"]
    assert workdir["status"] == "fail"
    # a hostfile's workdir holds the project's directory: /root/.ssh/<code dir name>
    assert workdir["detail"].startswith("the workdir /root/.ssh/") and \
        "is inside ssh's own directory" in workdir["detail"], workdir["detail"]
    assert workdir["fix"].startswith("give the job a directory of its own: "
                                     "add `--workdir '~/multihost/")
