"""One helper process per host for a whole sync (``sync.session`` on the host).

The controller starts it as soon as the host is connected (the interpreter starts on
the host while the controller hashes), writes the manifest, reads back the plan, and
later writes the stream of what differs into the same process (or just closes it when
the host is already identical). A host thus costs one process and one round trip for
the comparison, which is most of a no-change sync. A host of a relay chain whose stream
is all the relay's gets the chain's relay request instead (``become_node``): the same
process is then its node, with no second helper started on the host.
"""
from __future__ import annotations

import json
import struct
from typing import Callable, Optional

from .. import helper, waits
from ..errors import ConnectError, MultihostError, RemoteError
from ..remote.sync.plan import NO_MANIFEST
from ..remote.sync.wire import Writer, encode_node_request
from ..transport.base import BrokenStream
from .transfer import SendBuffer, close_process

OP = "sync.session"


class HostSession:
    def __init__(self, transport, process):
        self.transport = transport
        self.process = process
        self.closed = False
        self.request: dict = {}
        self.waiting: Optional[str] = None    # what the host said it waits for, if anything
        self.machine: Optional[str] = None    # its boot id and network namespace (machines.py)
        self.on_wait: Optional[Callable[[str], None]] = None

    @classmethod
    def start(cls, transport, request: dict) -> "HostSession":
        """Start the helper now, before the manifest is ready: its interpreter starts up
        on the host while the controller is still hashing."""
        session = cls(transport, helper.launch(transport, OP, request,
                                               first_line_within=waits.helper_start()))
        session.request = request
        return session

    def plan(self, count: int, manifest: Callable[[], bytes]) -> dict:
        """Send the manifest (``manifest()``: its bytes, made once for all hosts), or only
        ``count``, its number of entries, to a host that said its workdir is not there
        (a first sync: everything is added, the manifest is not needed); return the
        host's plan. Installs the helper if missing."""
        for attempt in (1, 2):
            process = self.process
            line = process.stdout.readline()
            while _waiting(line) is not None:  # another sync holds the workdir there
                self.waiting = _waiting(line)
                if self.on_wait is not None:
                    self.on_wait(self.waiting)
                line = process.stdout.readline()
            absent = _said_absent(line)
            if absent is not None:
                self.machine = _hello(line).get("machine")
                head = struct.pack(">II", NO_MANIFEST, count) if absent else None
                try:
                    if head is None:
                        body = manifest()
                        head = struct.pack(">I", len(body)) + body
                    process.stdin.write(head)
                    process.stdin.flush()
                except BrokenStream:  # it ended: its status says why
                    pass
                line = process.stdout.readline()
            if line:
                try:
                    reply = json.loads(line)
                except ValueError:
                    reply = None
                if isinstance(reply, dict) and reply.get("ok"):
                    return reply["result"]
            rest = process.stdout.read() if line else b""
            err = process.read_stderr()
            code = process.wait(60)
            close_process(process)
            self.closed = True
            if code == helper.MISSING and attempt == 1:
                helper.install(self.transport)
                self.process = helper.launch(self.transport, OP, self.request)
                self.closed = False
                continue
            helper.parse_reply(self.transport, OP, code if code else 1, line + rest, err)
        raise RemoteError("the sync helper would not start", host=self.transport.host.label,
                          fix="run `multihost check` on this host")

    def send(self, fill: Callable[[Writer], None], timeout: Optional[float] = None) -> dict:
        """Write the stream (``fill`` writes the records) and return the ``nodes`` reply."""
        label = self.transport.host.label
        sink = SendBuffer(self.process.stdin)
        try:
            writer = Writer(sink)
            fill(writer)
            writer.end()
            sink.flush()
        except MultihostError:
            self.abort()
            raise
        except BrokenStream as exc:
            self.abort()
            raise ConnectError(f"the connection broke while sending files ({exc})", host=label,
                               kind=ConnectError.LOST,
                               fix="check the host and the network, then sync again: it resumes"
                               ) from None
        result = self._finish(timeout)
        nodes = result.get("nodes") if isinstance(result, dict) else None
        if not isinstance(nodes, dict):
            raise RemoteError("the host's sync reply has no results", host=label,
                              fix="run the sync again")
        return nodes

    def become_node(self, request: dict):
        """Hand the session a relay node's request (relay.chain_requests); returns its
        process, which from now on is that node's (its caller ends its stdin, reads its
        answer and closes it, as for a ``sync.receive`` node). A session that is gone
        is a ConnectError naming the host: the chain goes around it."""
        self.closed = True  # the chain owns the process now
        try:
            self.process.stdin.write(encode_node_request(request))
            self.process.stdin.flush()
        except BrokenStream as exc:
            close_process(self.process)
            raise ConnectError(f"its sync session ended before it became a relay node ({exc})",
                               host=self.transport.host.label, kind=ConnectError.LOST,
                               fix="check the host, then sync again") from None
        return self.process

    def close(self) -> dict:
        """Nothing to send: end the session; returns its ``nodes`` reply (maybe empty)."""
        if self.closed:
            return {}
        result = self._finish(60)
        nodes = result.get("nodes") if isinstance(result, dict) else None
        return nodes if isinstance(nodes, dict) else {}

    def _finish(self, timeout: Optional[float]):
        self.closed = True
        try:
            self.process.stdin.close()
        except BrokenStream:  # the helper already ended; its reply says why
            pass
        out = self.process.stdout.read()
        err = self.process.read_stderr()
        code = self.process.wait(timeout)
        close_process(self.process)
        if not out.strip() and code == 0:
            return {}
        return helper.parse_reply(self.transport, OP, code, out, err)

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            close_process(self.process)


def _waiting(line: bytes) -> Optional[str]:
    """The text of a {"waiting": ...} line: the host's helper waits for the workdir."""
    if not line.startswith(b'{"waiting"'):
        return None
    try:
        return str(json.loads(line)["waiting"])
    except (ValueError, KeyError):
        return None


def _hello(line: bytes) -> dict:
    try:
        hello = json.loads(line)
    except ValueError:
        return {}
    return hello if isinstance(hello, dict) else {}


def _said_absent(line: bytes) -> Optional[bool]:
    """The session's first line: whether the host's workdir is missing; None when the
    line is something else (an error reply, or nothing: the helper is not there)."""
    hello = _hello(line)
    if "absent" not in hello:
        return None
    return hello["absent"] is True
