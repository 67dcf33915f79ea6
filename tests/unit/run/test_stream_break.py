"""A host's status stream on a slow or broken link: why it broke, as the run's views say
it (never an empty ()), and when a host that is slow, not gone, counts as lost."""
import json
import queue
import socket
import threading
import time

from multihost import helper
from multihost.hosts import Host
from multihost.run import status_streams
from multihost.run.status_streams import StatusStreams, what_broke

STATUS = json.dumps({"ok": True, "state": "running", "node": {}, "ranks": [],
                     "final": True}).encode() + b"\n"


def test_an_error_without_words_still_says_what_happened():
    assert what_broke(EOFError()) == "the connection closed"
    assert what_broke(OSError()) == "the connection failed (OSError)"
    assert what_broke(TimeoutError()) == "no answer in time"
    assert what_broke(OSError(104, "Connection reset by peer")) == "[Errno 104] Connection reset by peer"


class SlowStart:
    """A watch stream whose helper takes ``delay`` seconds to say its first status, and
    honours the read timeout it is given, as a socket does."""

    def __init__(self, delay):
        self.stdin, self.stdout = self, self
        self.delay, self.timeout, self.lines, self.written = delay, None, [STATUS], b""

    def set_timeout(self, seconds):
        self.timeout = seconds

    def started(self):
        pass

    def readline(self, size=-1):
        if not self.lines:
            return b""
        if self.timeout is not None and self.timeout < self.delay:
            raise socket.timeout("timed out")
        time.sleep(self.delay)
        return self.lines.pop(0)

    def write(self, data):
        self.written += data

    def flush(self):
        pass

    def close(self):
        pass


class Cluster:
    def __init__(self, host):
        self.hosts = (host,)

    def transport(self, host):
        return object()

    def forget(self, host):
        pass


def watched(host, stream, monkeypatch):
    """What one watch of ``stream`` put on the monitor's queue, in order."""
    answers: "queue.Queue[tuple]" = queue.Queue()
    stop = threading.Event()
    streams = StatusStreams(Cluster(host), "r1", 0.2, answers, stop)
    opened = []

    def start(transport, op, request):
        if opened:   # the watch opened a second stream: the first was given up on
            stop.set()
        opened.append(stream)
        return stream

    monkeypatch.setattr(helper, "start", start)
    streams.watch(host)
    return [answers.get_nowait() for _ in range(answers.qsize())], len(opened), streams


def test_a_loaded_host_whose_first_status_is_slower_than_a_heartbeat_is_not_given_up_on(
        monkeypatch):
    # 64 streams opening at once on busy cores: the helper's python takes longer to
    # start than a heartbeat's silence allows. That is not a dead link.
    monkeypatch.setattr(status_streams, "WATCH_SILENCE", 0.05)
    host = Host("198.18.0.11", rank=0)
    answers, opened, _ = watched(host, SlowStart(0.2), monkeypatch)
    assert opened == 1
    assert [kind for kind, *_ in answers] == ["contact", "status"]


def test_a_stream_that_reaches_the_host_counts_as_an_answer_before_its_first_status(
        monkeypatch):
    host = Host("198.18.0.11", rank=0)
    before = time.time()
    answers, _, _ = watched(host, SlowStart(0.0), monkeypatch)
    kind, rank, payload, when = answers[0]
    assert (kind, rank, payload) == ("contact", 0, None) and when >= before


def test_a_lost_host_whose_stream_comes_back_is_asked_to_stop(monkeypatch):
    host = Host("198.18.0.11", rank=0)
    stream = SlowStart(0.0)
    answers: "queue.Queue[tuple]" = queue.Queue()
    streams = StatusStreams(Cluster(host), "r1", 0.2, answers, threading.Event())
    streams.stop_when_back(host, 1.0, "teardown: 198.18.0.12 (node 1) failed")
    monkeypatch.setattr(helper, "start", lambda transport, op, request: stream)
    streams.watch(host)
    assert json.loads(stream.written) == {
        "stop": {"grace": 1.0, "reason": "teardown: 198.18.0.12 (node 1) failed"}}
