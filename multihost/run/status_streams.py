"""The status streams of a followed run: one ``run.watch`` stream per host, reopened when
it breaks, and the way a stop request reaches a host.

Apart from monitor.py because this is the talking (threads, sessions, reconnects, bytes
on a stream) and the monitor is the deciding: every answer and every broken stream is put
on the monitor's queue as ``(kind, rank, payload, time)`` and judged there, so a stream
never decides anything about the run.

A status line comes on every change and at least every HEARTBEAT seconds, so a stream that
is silent for WATCH_SILENCE seconds is a dead link: it is closed and opened again.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from typing import Dict, Tuple

from .. import helper, waits
from ..errors import CommandTimeout, ConnectError, MultihostError, RemoteError
from .outcome import parse_status

HEARTBEAT = 1.0         # a status line at least this often, changed or not
WATCH_SILENCE = 5.0     # no line for this long: the stream is dead, reconnect
MAX_RECORD = 8 << 20    # bytes of one status record line (tails included)
RETRY_EVERY = 1.0


class StatusStreams:
    """Every host's ``run.watch`` stream, each followed by its own thread until
    ``stop_polling`` is set; what they hear goes on ``answers``."""

    def __init__(self, cluster, run_id: str, poll_interval: float,
                 answers: "queue.Queue[tuple]", stop_polling: threading.Event):
        self.cluster = cluster
        self.run_id = run_id
        self.poll_interval = poll_interval
        self.answers = answers
        self.stop_polling = stop_polling
        self.live: Dict[int, object] = {}    # each host's live watch stream
        self.stop_asked: Dict[int, Tuple[float, str]] = {}   # (grace, reason) sent to a host
        self.lock = threading.Lock()

    def open(self, host) -> None:
        """Follow a host's status on a thread of its own."""
        threading.Thread(target=self.watch, args=(host,), name=f"watch-{host.label}",
                         daemon=True).start()

    def watch(self, host) -> None:
        """Stream the node's status (``run.watch``); reconnect when the stream dies. A
        heartbeat comes every second, so a read that waits WATCH_SILENCE is a dead link."""
        while not self.stop_polling.is_set():
            process = None
            try:
                transport = self.cluster.transport(host)
                # Streams open once every node launched (start.py): each carries that
                # word to its node, which a separate call would cost a round trip.
                process = helper.start(transport, "run.watch", {
                    "run_id": self.run_id, "interval": self.poll_interval,
                    "heartbeat": HEARTBEAT, "stoppable": True, "launched": True,
                    "quick_for": waits.quick_start(len(getattr(self.cluster, "hosts", ())))})
                with self.lock:
                    self.live[host.rank] = process
                    asked = self.stop_asked.get(host.rank)
                if asked is not None:  # the stream it was sent on broke: say it again
                    self._send_stop(process, *asked)
                # The host's shell ran the helper: it answers. Its first line may then take
                # a python start, seconds on a loaded host (64 streams open at once): that
                # is not a dead link, and a stream given up on then would start another.
                process.set_timeout(waits.helper_start())
                process.stdout.started()
                self.answers.put(("contact", host.rank, None, time.time()))
                first = True
                # A record is a few kB; a host sending an endless line is not waited on.
                for raw in iter(lambda: process.stdout.readline(MAX_RECORD), b""):
                    if first:   # from now on a heartbeat comes every second
                        process.set_timeout(WATCH_SILENCE)
                        first = False
                    reply = json.loads(raw.decode("utf-8", "replace"))
                    if not isinstance(reply, dict) or not raw.endswith(b"\n"):
                        raise ValueError("a status record that is not a JSON object line")
                    if reply.get("ok") is False:
                        raise RemoteError(str(reply.get("error")), host=host.label)
                    self.answers.put(("status", host.rank, parse_status(reply), time.time()))
                    if reply.get("final") or self.stop_polling.is_set():
                        return
                raise ConnectError("the status stream ended", host=host.label,
                                   kind=ConnectError.LOST)
            except (ConnectError, CommandTimeout, OSError, EOFError, ValueError) as err:
                if self.stop_polling.is_set():
                    return
                if not isinstance(err, MultihostError):
                    err = ConnectError(f"the status stream broke ({what_broke(err)})",
                                       host=host.label, kind=ConnectError.LOST)
                self.cluster.forget(host)
                self.answers.put(("error", host.rank, err, time.time()))
            except MultihostError as err:
                self.answers.put(("error", host.rank, err, time.time()))
            finally:
                if process is not None:
                    with self.lock:
                        if self.live.get(host.rank) is process:
                            del self.live[host.rank]
                    process.close()
            self.stop_polling.wait(RETRY_EVERY)

    def stop(self, host, grace: float, reason: str) -> None:
        """Ask a host to stop: on its watch stream when it has one, else by a
        ``run.stop`` call on a thread of its own (the answer comes on ``answers``)."""
        if not self.stop_by_stream(host, grace, reason):
            threading.Thread(target=self._stop_by_call, args=(host, grace, reason),
                             name=f"stop-{host.label}", daemon=True).start()

    def stop_when_back(self, host, grace: float, reason: str) -> None:
        """A lost host is asked to stop by the next stream that reaches it (none may)."""
        with self.lock:
            self.stop_asked[host.rank] = (grace, reason)

    def stop_by_stream(self, host, grace: float, reason: str) -> bool:
        """Ask a host to stop through its watch stream: no new session, no new helper on
        the host, no thread here (a teardown of 64 hosts spent seconds starting 64
        threads on a busy controller); the stream then reports the stop. False when the
        host has no live stream. A send waits at most the stream's read timeout."""
        # Under the lock: a stream that ends (its host finished as the stop was decided)
        # leaves ``live`` before it is closed, so a stream found here is still open.
        with self.lock:
            self.stop_asked[host.rank] = (grace, reason)  # a stream opened later says it too
            process = self.live.get(host.rank)
            if process is None:
                return False
            try:
                self._send_stop(process, grace, reason)
                return True
            except OSError:
                return False  # the stream broke just now

    def close_all(self) -> None:
        """Close every live stream (``stop_polling`` is set first: no thread reopens)."""
        with self.lock:
            streams = list(self.live.values())
        for process in streams:
            process.close()

    @staticmethod
    def _send_stop(process, grace: float, reason: str) -> None:
        """A stop request on a watch stream's stdin (``run.watch`` acts on it); raises
        BrokenStream (an OSError) when the stream is gone."""
        line = json.dumps({"stop": {"grace": grace, "reason": reason}}) + "\n"
        process.stdin.write(line.encode())
        process.stdin.flush()

    def _stop_by_call(self, host, grace: float, reason: str) -> None:
        """Stop the run on a host with no live watch stream: a ``run.stop`` call."""
        try:
            transport = self.cluster.transport(host)
            reply = helper.call(transport, "run.stop", {"run_id": self.run_id,
                                                        "grace": grace, "reason": reason},
                                timeout=grace + 30)
            self.answers.put(("status", host.rank, parse_status(reply), time.time()))
        except MultihostError as err:
            self.answers.put(("error", host.rank, err, time.time()))


def what_broke(err: BaseException) -> str:
    """Why a stream ended, for a person: the error's own words, or, for the errors that
    have none (an EOFError, a bare OSError), what happened."""
    text = str(err).strip()
    if text:
        return text
    if isinstance(err, EOFError):
        return "the connection closed"
    if isinstance(err, TimeoutError):
        return "no answer in time"
    return f"the connection failed ({type(err).__name__})"
