"""The helper's probes on this machine, for real: sockets, processes, /proc, ICMP. The same
code runs on every host through one helper call (see tests/lab/test_check.py)."""
import errno
import shutil
import json
import os
import secrets
import socket
import subprocess
import sys
import time

import pytest

from multihost.remote.check import ping as net_ping
from multihost.remote.check import ops as ops_check
from multihost.remote.check import net

# Its own in each test process: the scan sees every process of this user, and another
# worker's test (or another checkout's) leaves a sleeper with its run id meanwhile.
RUN_ID = "20261121-101500-" + secrets.token_hex(2)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_listening_port_is_busy_and_names_its_process():
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen()
        port = server.getsockname()[1]
        facts = ops_check.ports_facts({"ports": [port, free_port()]})
    assert [b["port"] for b in facts["busy"]] == [port]
    assert facts["busy"][0]["pid"] == os.getpid()
    assert "python" in facts["busy"][0]["command"]


def test_a_port_bound_without_listening_is_busy_too():
    with socket.socket() as bound:
        bound.bind(("0.0.0.0", 0))  # what /proc/net/tcp does not show as a listener
        port = bound.getsockname()[1]
        facts = ops_check.ports_facts({"ports": [port]})
    assert [b["port"] for b in facts["busy"]] == [port]


def test_our_own_listener_does_not_count_as_busy():
    listener = net.Listener(free_port(), "t")
    try:
        facts = ops_check.ports_facts({"ports": [listener.port], "own_ports": [listener.port],
                                       "own_inodes": [listener.inode], "scan": [1, 65535]})
    finally:
        listener.close()
    assert facts["busy"] == [] and listener.port not in facts["listening"]


def test_auto_scan_lists_listeners_in_the_range():
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen()
        port = server.getsockname()[1]
        facts = ops_check.ports_facts({"ports": [], "scan": [port - 1, port + 1]})
    assert port in facts["listening"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_leftovers_are_found_by_their_run_id(home):
    env = dict(os.environ, MULTIHOST_RUN_ID=RUN_ID)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 5
        runs = []
        while time.monotonic() < deadline and not runs:
            runs = [r for r in ops_check.leftover_facts({}) if r["run_id"] == RUN_ID]
        assert runs and sleeper.pid in runs[0]["pids"]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not [r for r in ops_check.leftover_facts({}) if r["run_id"] == RUN_ID]


def test_a_live_run_record_is_a_leftover(home):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_dir = home / ".multihost" / "runs" / RUN_ID
        run_dir.mkdir(parents=True)
        (run_dir / "node.json").write_text(json.dumps(
            {"run_id": RUN_ID, "state": "running", "pid": sleeper.pid, "pgid": sleeper.pid}))
        runs = [r for r in ops_check.leftover_facts({}) if r["run_id"] == RUN_ID]
        assert [(r["pids"], r["pgid"]) for r in runs] == [([sleeper.pid], sleeper.pid)]
        (run_dir / "node.json").write_text(json.dumps(
            {"run_id": RUN_ID, "state": "succeeded", "pid": sleeper.pid}))
        assert RUN_ID not in [r["run_id"] for r in ops_check.leftover_facts({})]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_rendezvous_listener_greets_and_records_ranks():
    listener = net.Listener(free_port(), "tok123")
    try:
        assert listener.error is None
        result = net.connect_master("127.0.0.1", listener.port, "tok123", 3, timeout=2)
        assert result["ok"] and result["ms"] >= 0
        # The listener records the rank in its own thread, after the connect returned:
        # on busy cores that thread may run seconds later.
        deadline = time.monotonic() + 30
        while not listener.accepted and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        report = listener.close()
    assert report["listening"] and [a["rank"] for a in report["accepted"]] == [3]
    with socket.socket() as again:  # closing released the port at once
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("0.0.0.0", listener.port))


def test_a_foreign_server_on_the_port_is_not_taken_for_ours():
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        started = time.monotonic()
        result = net.connect_master("127.0.0.1", foreign.getsockname()[1], "tok", 1, timeout=3)
    assert result["error"] == "foreign"
    assert time.monotonic() - started < 2.5


def test_a_refused_port_is_retried_then_reported():
    port = free_port()
    started = time.monotonic()
    result = net.connect_master("127.0.0.1", port, "tok", 1, timeout=0.5)
    assert result == {"ok": False, "error": "refused", "text": "Connection refused"}
    assert 0.4 < time.monotonic() - started < 2


def test_a_lost_first_resolution_of_the_master_is_retried(monkeypatch):
    # On a busy network the first SYN to the master can die with its ARP request; the
    # next try (within the window) gets through, as a real worker's would.
    listener = net.Listener(free_port(), "tok9")
    real = socket.create_connection
    calls = []

    def flaky(address, timeout=None):
        calls.append(timeout)
        if len(calls) == 1:
            raise OSError(errno.EHOSTUNREACH, "No route to host")
        return real(address, timeout)

    monkeypatch.setattr(net.socket, "create_connection", flaky)
    try:
        result = net.connect_master("127.0.0.1", listener.port, "tok9", 5, timeout=3)
    finally:
        listener.close()
    assert result["ok"] and len(calls) == 2


def test_a_peer_silent_at_first_is_pinged_again(monkeypatch):
    # The first echo of a peer whose link address is still being resolved goes
    # unanswered; a second round finds it, so the check does not call it unreachable.
    rounds = []

    def first_round_lost(family, addresses, timeout, tries):
        rounds.append(list(addresses))
        return {a: (None if len(rounds) == 1 and a == "10.9.9.2" else 0.1) for a in addresses}

    monkeypatch.setattr(net_ping, "_icmp_ping", first_round_lost)
    rtt, method = net_ping.ping_many(["10.9.9.1", "10.9.9.2"], timeout=0.1)
    assert rtt == {"10.9.9.1": 0.1, "10.9.9.2": 0.1} and method == "icmp"
    assert rounds == [["10.9.9.1", "10.9.9.2"], ["10.9.9.2"]]


def test_a_busy_port_stops_the_listener_with_the_reason():
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen()
        listener = net.Listener(server.getsockname()[1], "t")
        assert listener.close()["error"] == "Address already in use"


def test_ping_this_machine():
    rtt, method = net_ping.ping_many(["127.0.0.1"], timeout=1.0)
    if method is None:
        pytest.skip("ICMP is not permitted here")
    assert rtt["127.0.0.1"] is not None and rtt["127.0.0.1"] < 1000


# An address nothing answers, reached inside a private network namespace whose only link
# is a bridge with no port (nothing answers on it): the echo request never leaves it.
SILENT_PING = """
import json, sys
from multihost.remote.check import ping as net_ping
print(json.dumps(net_ping.ping_many(["198.18.0.254"], timeout=0.3, tries=1)[0]))
"""
SILENT_NET = ("ip link set lo up && ip link add mhsilent type bridge && "
              "ip addr add 198.18.0.1/24 dev mhsilent && ip link set mhsilent up && exec \"$0\" -c \"$1\"")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root for a private network namespace")
def test_ping_reports_silence_not_an_error():
    done = subprocess.run(["unshare", "--net", "sh", "-c", SILENT_NET, sys.executable, SILENT_PING],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"198.18.0.254": None}


def test_interfaces_and_route():
    assert "lo" in net.interface_names()
    assert net.route_source("127.0.0.1") == "127.0.0.1"
    assert net.iface_of_address("127.0.0.1") == "lo"  # not in the main table: via `ip`
    assert net.is_local_address("127.0.0.1")
    assert not net.is_local_address("198.18.0.254")


def test_python_probe_is_cached_until_its_paths_change(home, tmp_path, monkeypatch):
    extra = tmp_path / "extra"
    extra.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(extra))
    first = ops_check.python_facts({})
    assert "error" not in first and not first.get("cached")
    assert first["version"] == sys.version.split()[0]
    assert ops_check.python_facts({}).get("cached")
    time.sleep(0.01)
    (extra / "torch").mkdir()  # a package appears on the path: the answer must change
    (extra / "torch" / "__init__.py").write_text("")
    (extra / "torch" / "version.py").write_text("__version__ = '9.9.9'\ncuda = None\n")
    fresh = ops_check.python_facts({})
    assert not fresh.get("cached") and "9.9.9" in fresh["torch"]["version_py"]


def test_a_hung_probe_is_reported_and_not_waited_for(monkeypatch):
    monkeypatch.setitem(ops_check.PROBES, "disk", lambda request: time.sleep(5))
    started = time.monotonic()
    facts = ops_check.gather({"probes": ["disk", "hostname"], "budget": 0.3})
    assert time.monotonic() - started < 1.5
    assert facts["timed_out"] == ["disk"] and "hostname" in facts


def test_a_probe_given_a_longer_budget_is_waited_for_while_the_others_keep_theirs(monkeypatch):
    import threading

    never = threading.Event()
    monkeypatch.setitem(ops_check.PROBES, "image", lambda request: time.sleep(0.5) or {"id": 1})
    monkeypatch.setitem(ops_check.PROBES, "disk", lambda request: never.wait(30))
    facts = ops_check.gather({"probes": ["image", "disk", "hostname"], "budget": 0.2,
                              "budgets": {"image": 60.0}})
    assert facts["image"] == {"id": 1}   # past the common budget, within its own
    assert facts["timed_out"] == ["disk"] and "hostname" in facts


def test_disk_facts_for_a_workdir_not_made_yet(tmp_path):
    facts = ops_check.disk_facts({"workdir": str(tmp_path / "a" / "b")})
    assert facts["exists"] is False and facts["existing"] == str(tmp_path)
    assert facts["writable"] and facts["free"] > 0


def test_a_run_record_whose_supervisor_pid_was_reused_is_not_a_leftover(home):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(f"/proc/{sleeper.pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        run_dir = home / ".multihost" / "runs" / RUN_ID
        run_dir.mkdir(parents=True)
        record = {"run_id": RUN_ID, "state": "prepared", "pgid": sleeper.pid,
                  "supervisor": {"pid": sleeper.pid, "ticks": ticks}}
        (run_dir / "node.json").write_text(json.dumps(record))
        assert RUN_ID in [r["run_id"] for r in ops_check.leftover_facts({})]
        record["supervisor"]["ticks"] = ticks - 1  # the pid now belongs to another process
        (run_dir / "node.json").write_text(json.dumps(record))
        assert RUN_ID not in [r["run_id"] for r in ops_check.leftover_facts({})]
    finally:
        sleeper.kill()
        sleeper.wait()
