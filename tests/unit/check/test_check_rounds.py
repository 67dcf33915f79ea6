"""The preflight's rendezvous round: the other hosts' calls start at once, but probe the
first host's listener only once it has said whether it listens (at 64 busy hosts its session may come up
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
        note(("hold", request["hold"], deadline - time.monotonic()))
        time.sleep(first_delay)  # the first host's session comes up late
        note(("first listens", op))
        return FakeProcess(), b'{"listening": true}\n', SimpleNamespace(cancel=lambda: None)

    def launch(transport, op, request):
        # A peer's call starts at once; its connect probe waits for the word on stdin.
        note(("peer starts", tuple(request["probes"])))
        peer = FakeProcess()
        peer.stdin = SimpleNamespace(write=lambda data: note(("peer may connect", data)),
                                     close=lambda: None)
        peer.kill = lambda: None
        return peer

    def parse_reply(transport, op, code, out, err):
        return {"time": time.time(), **({"connect": {"ok": True}} if op == "check.host" else {})}

    monkeypatch.setattr(rounds, "start", start)
    monkeypatch.setattr(rounds.helper, "launch", launch)
    monkeypatch.setattr(rounds.helper, "parse_reply", parse_reply)
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
    listens = events.index(("first listens", "check.host_hold"))
    peers = [e for e in events if e[0] == "peer starts"]
    assert len(peers) == 3 and all("connect" in probes for _, probes in peers)
    told = [i for i, e in enumerate(events) if e[0] == "peer may connect"]
    assert len(told) == 3 and min(told) > listens
    assert all(s.rendezvous == {"ok": True} for s in sessions[1:])


def test_the_first_host_holds_its_listener_until_the_rounds_deadline(monkeypatch):
    """A peer whose helper starts late on a busy host connects late: the listener is
    still there (the controller ends it once every peer is done), not closed on its own
    a budget after the first host's facts, and the peer's call told `refused`."""
    events, _ = run_round(monkeypatch, first_delay=0.0)
    (_, hold, left), = [e for e in events if e[0] == "hold"]
    assert hold >= left > rounds.CALL_SLACK + 5.0   # the round's connect time and all
