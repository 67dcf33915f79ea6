"""The preflight's rendezvous round: the other hosts probe the first host's listener
only once it has said whether it listens (at 64 busy hosts its session may come up
seconds after theirs; a refusal from a listener not yet there is not a firewall)."""
import threading
import time
from types import SimpleNamespace

from multihost.check import rounds
from multihost.hosts import Host


class FakeProcess:
    """The first host's held call: its reply comes once the controller closes stdin."""

    def __init__(self):
        self.stdin = SimpleNamespace(close=lambda: None)
        self.stdout = SimpleNamespace(read=lambda: b'{"ok": true, "result": {"time": 0}}\n')

    def wait(self, timeout):
        return 0

    def read_stderr(self):
        return b""

    def close(self):
        pass


def run_round(monkeypatch, first_delay: float):
    events = []
    lock = threading.Lock()

    def note(what):
        with lock:
            events.append(what)

    def start(transport, op, request, deadline):
        time.sleep(first_delay)  # the first host's session comes up late
        note(("first listens", op))
        return FakeProcess(), b'{"listening": true}\n', SimpleNamespace(cancel=lambda: None)

    def call(transport, op, request, timeout):
        note(("peer probes", tuple(request["probes"])))
        return {"time": time.time(), "connect": {"ok": True}}

    monkeypatch.setattr(rounds, "start", start)
    monkeypatch.setattr(rounds, "call", call)
    monkeypatch.setattr(rounds.helper, "parse_reply", lambda *a: {"time": time.time()})
    hosts = [Host(f"10.0.0.{i}", rank=i) for i in range(4)]
    cluster = SimpleNamespace(options=SimpleNamespace(connect_timeout=5), workers=8,
                              transport=lambda host: SimpleNamespace(host=host))
    sessions = [rounds.Session(h) for h in hosts]
    for session in sessions:
        session.address = session.host.name
    round_ = rounds.Round(cluster, sessions, 17000, budget=5.0, notify=lambda *a: None)
    round_.run([{"probes": ["ports"]} for _ in hosts], None)
    return events, sessions


def test_the_other_hosts_connect_only_after_the_first_host_listens(monkeypatch):
    events, sessions = run_round(monkeypatch, first_delay=0.5)
    assert events[0] == ("first listens", "check.host_hold")
    peers = [e for e in events if e[0] == "peer probes"]
    assert len(peers) == 3 and all("connect" in probes for _, probes in peers)
    assert all(s.rendezvous == {"ok": True} for s in sessions[1:])
