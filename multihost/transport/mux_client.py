"""A client of OpenSSH's control-socket protocol (openssh-portable's PROTOCOL.mux,
version 4): a command run on a host through its ControlMaster without an `ssh` process.

An `ssh -o ControlPath=...` client costs the controller 5-7 ms of CPU (fork, exec,
reading its config, then this very protocol); a quick step at 64 hosts paid that 64
times. Here the controller speaks the protocol itself, as a "passenger" client does:

    hello (version 4) both ways
    NEW_SESSION (no tty, no X11, no agent, no escape character, the command)
    the command's stdin, stdout and stderr: pipe ends passed over the socket
        (SCM_RIGHTS, one descriptor per message, as ssh sends them)
    SESSION_OPENED (or PERMISSION_DENIED / FAILURE with a reason)
    ... the master moves the data between the pipes and the SSH channel ...
    EXIT_MESSAGE (the exit status), then the master closes the socket

The control connection stays open for the session's life: closing it makes the master
close the session. A session that ends without an EXIT_MESSAGE (the master died, the
command was killed by a signal) is exit 255, as the `ssh` client reports it.

Everything before SESSION_OPENED that goes wrong is a ``MuxRefused``, so the caller can
take another way having lost nothing: no byte of the command's input was sent yet.
"""
from __future__ import annotations

import os
import socket
import struct
import time
from dataclasses import dataclass
from typing import Optional, Tuple

from ..untrusted import clean_line

VERSION = 4
MUX_MSG_HELLO = 0x00000001
MUX_C_NEW_SESSION = 0x10000002
MUX_S_OK = 0x80000001
MUX_S_PERMISSION_DENIED = 0x80000002
MUX_S_FAILURE = 0x80000003
MUX_S_EXIT_MESSAGE = 0x80000004
MUX_S_ALIVE = 0x80000005
MUX_S_SESSION_OPENED = 0x80000006
MUX_S_TTY_ALLOC_FAIL = 0x80000008
NO_ESCAPE = 0xFFFFFFFF
LOST = 255                 # the exit status of a session that ended without one
MAX_MESSAGE = 64 * 1024    # a master's messages are a few bytes; more is not a master
# Replies that carry a reason string after their request id.
_WITH_REASON = (MUX_S_PERMISSION_DENIED, MUX_S_FAILURE)


class MuxRefused(Exception):
    """No session: the socket, the master or its answer said no (the reason, one line)."""


class NotOurs(MuxRefused):
    """The socket answers for a process of another user: nothing goes through it."""


class NoAnswer(MuxRefused):
    """The master took the request and did not answer in time: it is stuck, and an `ssh`
    client through it would wait just as long."""


class MuxProtocolError(MuxRefused):
    """The other end does not speak this protocol: a short or unknown message."""


# -- the codec: messages as bytes, bytes as messages ------------------------------------

def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def frame(body: bytes) -> bytes:
    """A message on the wire: its length, then its body (type first)."""
    return _string(body)


def hello() -> bytes:
    """The client's hello: version 4, no extensions."""
    return frame(struct.pack(">II", MUX_MSG_HELLO, VERSION))


def new_session(request_id: int, command: bytes, term: bytes = b"") -> bytes:
    """A passenger session running ``command``: no tty, no X11, no agent, not a
    subsystem, no escape character; ssh sends its flags as uint32s, as here."""
    return frame(struct.pack(">II", MUX_C_NEW_SESSION, request_id) + _string(b"")
                 + struct.pack(">IIIII", 0, 0, 0, 0, NO_ESCAPE)
                 + _string(term) + _string(command))


@dataclass(frozen=True)
class Reply:
    """One message from the master. ``first`` and ``second`` are its numbers in order:
    hello (version), SESSION_OPENED (request id, session id), EXIT_MESSAGE (session id,
    exit status), ALIVE (request id, pid), TTY_ALLOC_FAIL (session id), a refusal
    (request id, with ``reason``), OK (request id)."""

    kind: int
    first: int = 0
    second: int = 0
    reason: str = ""


_NUMBERS = {MUX_MSG_HELLO: 1, MUX_S_OK: 1, MUX_S_PERMISSION_DENIED: 1, MUX_S_FAILURE: 1,
            MUX_S_EXIT_MESSAGE: 2, MUX_S_ALIVE: 2, MUX_S_SESSION_OPENED: 2,
            MUX_S_TTY_ALLOC_FAIL: 1}


def parse(body: bytes) -> Reply:
    """A message body (after its length) as a Reply; MuxProtocolError if it is none."""
    if len(body) < 4:
        raise MuxProtocolError("a message shorter than its type")
    (kind,) = struct.unpack_from(">I", body)
    count = _NUMBERS.get(kind)
    if count is None:
        raise MuxProtocolError(f"an unknown message 0x{kind:08x}")
    end = 4 + 4 * count
    if len(body) < end:
        raise MuxProtocolError(f"a short message 0x{kind:08x}")
    numbers = struct.unpack_from(f">{count}I", body, 4) + (0,)
    reason = ""
    if kind in _WITH_REASON:
        if len(body) < end + 4:
            raise MuxProtocolError("a refusal without its reason")
        (size,) = struct.unpack_from(">I", body, end)
        reason = clean_line(body[end + 4:end + 4 + size])  # only ever shown as text
    # hello's extensions (name, value pairs) follow; none is defined that we use
    return Reply(kind, numbers[0], numbers[1], reason)


# -- the connection ---------------------------------------------------------------------

class _Channel:
    """The control socket with what was read of a message not yet whole, so a read that
    times out half-way loses nothing."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_fd(self, fd: int) -> None:
        """One descriptor with one byte, as OpenSSH's mm_send_fd does (the master reads
        them one message each)."""
        self.sock.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                     struct.pack("i", fd))])

    def read(self, deadline: Optional[float]) -> Optional[Reply]:
        """The next message; None when the master closed the socket. A timeout at the
        deadline (socket.timeout, an OSError)."""
        while True:
            if len(self._buffer) >= 4:
                (size,) = struct.unpack_from(">I", self._buffer)
                if size > MAX_MESSAGE:
                    raise MuxProtocolError(f"a message of {size} bytes")
                if len(self._buffer) >= 4 + size:
                    body, self._buffer = self._buffer[4:4 + size], self._buffer[4 + size:]
                    return parse(body)
            if deadline is not None:
                self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            else:
                self.sock.settimeout(None)
            data = self.sock.recv(65536)
            if not data:
                return None
            self._buffer += data


def connect(path: str, timeout: float) -> _Channel:
    """The master's socket, checked to be a process of ours (the directory it is in was
    checked private; this holds even for a socket some other way put there)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            raise NotOurs(f"the socket's process is user {uid}'s, not ours")
    except BaseException:
        sock.close()
        raise
    return _Channel(sock)


class MuxSession:
    """One command running through a master. ``open`` returns it once the master said
    the session is open; ``wait`` reads its exit status; ``end`` closes the session."""

    def __init__(self, channel: _Channel, session_id: int):
        self._channel = channel
        self.session_id = session_id
        self.exit_status: Optional[int] = None   # set once the session has ended
        self.ended = False

    @classmethod
    def open(cls, path: str, command: bytes, fds: Tuple[int, int, int],
             timeout: float) -> "MuxSession":
        """Ask the master at ``path`` for a session running ``command`` with ``fds`` as
        its stdin, stdout and stderr (the caller keeps its copies; the master gets its
        own). MuxRefused, and nothing left open, for anything short of SESSION_OPENED
        within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            channel = connect(path, timeout)
        except NotOurs:
            raise
        except socket.timeout:
            raise NoAnswer(f"the master did not take the connection within {timeout:.0f}s") \
                from None
        except OSError as exc:
            raise MuxRefused(f"cannot reach the master: {exc.strerror or exc}") from None
        try:
            channel.send(hello())
            reply = channel.read(deadline)
            if reply is None or reply.kind != MUX_MSG_HELLO:
                raise MuxProtocolError("no hello from the master")
            if reply.first != VERSION:
                raise MuxRefused(f"the master speaks version {reply.first}, not {VERSION}")
            channel.send(new_session(1, command))  # no tty: no terminal type either
            for fd in fds:
                channel.send_fd(fd)
            reply = channel.read(deadline)
            if reply is None:
                raise MuxRefused("the master closed the connection")
            if reply.kind in _WITH_REASON:
                raise MuxRefused(f"the master refused the session: {reply.reason}")
            if reply.kind != MUX_S_SESSION_OPENED or reply.first != 1:
                raise MuxProtocolError(f"an unexpected reply 0x{reply.kind:08x}")
        except socket.timeout:
            channel.sock.close()
            raise NoAnswer(f"the master did not answer within {timeout:.0f}s") from None
        except OSError as exc:  # the master went away
            channel.sock.close()
            raise MuxRefused(f"the master did not open a session: {exc}") from None
        except BaseException:
            channel.sock.close()
            raise
        return cls(channel, reply.second)

    def wait(self, deadline: Optional[float] = None) -> int:
        """The exit status, once the master closed the socket (its data is all
        delivered by then): the status it sent, else 255. socket.timeout at the deadline."""
        while not self.ended:
            try:
                reply = self._channel.read(deadline)
            except MuxProtocolError:
                reply = None  # not a master any more: the session is lost
            except socket.timeout:
                raise
            except OSError:
                reply = None
            if reply is None:
                self.ended = True
                self._channel.sock.close()
            elif reply.kind == MUX_S_EXIT_MESSAGE and reply.first == self.session_id \
                    and self.exit_status is None:
                self.exit_status = reply.second & 0xFF   # what an exiting `ssh` gives
        return LOST if self.exit_status is None else self.exit_status

    def close(self) -> None:
        """Let the socket go (after ``end`` or the session's end)."""
        self.end()
        self._channel.sock.close()

    def end(self) -> None:
        """Close the session (the master then closes its channel: the remote command
        gets end of input and a closed output). A ``wait`` under way returns."""
        try:
            self._channel.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass
