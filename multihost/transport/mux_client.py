"""A command through a live OpenSSH master, spoken to over its control socket.

The quick steps of a sync (a host's `stat`, the probe that finds which hosts share a
directory) run one short command on every host through the master an earlier command
left (openssh.py). Started as an `ssh` client each, they cost a process that loads
OpenSSH and its crypto library and reads the config files, about 6 ms of CPU per host:
at 64 hosts, most of what the probe costs. Here the controller speaks the master's own
multiplexing protocol (OpenSSH's PROTOCOL.mux, "passenger" sessions, version 4, stable
since OpenSSH 5.x) and hands it this process's pipes as the command's stdin, stdout
and stderr, as the `ssh` client hands its own. Written by hand: no maintained Python
library speaks this protocol (paramiko and asyncssh open connections of their own).

A ``MuxChannel`` is Popen-like, so the OpenSSH transport treats it as it treated the
`ssh` client's process. The request goes out at once (the master reads a request's
bytes exactly, so the descriptors that follow it are never read as data, as with the
`ssh` client); its answers are read while the command's output is, within the caller's
time. A master that cannot be reached or refuses the session makes the command end with
status 255 and the reason on stderr, as the client did; a session that ends without an
exit status (a signal, a master gone) is 255 too.
"""
from __future__ import annotations

import os
import selectors
import socket
import struct
import subprocess
import time
from typing import Dict, IO, List, Optional, Tuple

HELLO = 0x00000001
NEW_SESSION = 0x10000002
S_PERMISSION_DENIED = 0x80000002
S_FAILURE = 0x80000003
S_EXIT_MESSAGE = 0x80000004
S_SESSION_OPENED = 0x80000006
VERSION = 4
NO_ESCAPE = 0xFFFFFFFF
LOST = 255   # what an `ssh` client exits with when the session has no status


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _packet(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def session_request(line: str, request_id: int = 1) -> bytes:
    """A new session running ``line``: no tty, X11 or agent, no escape character, no
    environment (as the paramiko path sends none)."""
    return _packet(struct.pack(">II", NEW_SESSION, request_id) + _string(b"")
                   + struct.pack(">IIIII", 0, 0, 0, 0, NO_ESCAPE) + _string(b"")
                   + _string(line.encode("utf-8", "surrogateescape")))


def _request(path: str, line: str, stdio: List[int]) -> socket.socket:
    """The control connection, our hello and the session's request sent on it, with
    the command's stdin, stdout and stderr (OSError when the master cannot be reached)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        sock.sendall(_packet(struct.pack(">II", HELLO, VERSION)) + session_request(line))
        for fd in stdio:
            socket.send_fds(sock, [b"\0"], [fd])
    except OSError:
        sock.close()
        raise
    return sock


class MuxChannel:
    """One command through the master at ``path``, with pipes of ours as its stdio
    (``with_stdin``: a pipe to write to; otherwise /dev/null). Popen-like: ``stdin``,
    ``stdout``, ``stderr``, ``returncode``, ``wait``, ``communicate``, ``kill``."""

    pid = None   # no local process stands for the command

    def __init__(self, path: str, line: str, with_stdin: bool = False):
        self.args = line
        self.returncode: Optional[int] = None
        self._status: Optional[int] = None
        self._refused = ""          # why the master would not run it
        self._buffer = b""          # the control connection's bytes not yet a packet
        self._read: Dict[IO[bytes], List[bytes]] = {}   # outputs read, across calls
        self.stdin: Optional[IO[bytes]] = None
        ours: List[int] = []
        theirs: List[int] = []
        if with_stdin:
            read, write = os.pipe()
            theirs.append(read)
            ours.append(write)
        else:
            theirs.append(os.open(os.devnull, os.O_RDONLY))
        for _ in ("stdout", "stderr"):
            read, write = os.pipe()
            theirs.append(write)
            ours.append(read)
        self._sock: Optional[socket.socket] = None
        try:
            self._sock = _request(path, line, theirs)
        except OSError as err:
            self.returncode = self._status = LOST   # as the `ssh` client, with its reason
            os.write(theirs[-1], f"multihost: the master at {path} cannot be reached "
                                 f"({err.strerror or err})\n".encode())
        finally:
            for fd in theirs:
                os.close(fd)
        if with_stdin:
            self.stdin = os.fdopen(ours.pop(0), "wb")
        self.stdout = os.fdopen(ours[0], "rb")
        self.stderr = os.fdopen(ours[1], "rb")
        for stream in (self.stdout, self.stderr):
            self._read[stream] = []

    def _refuse(self, why: str) -> None:
        self._refused = f"multihost: {why}\n"
        self.kill()

    def _feed(self) -> bool:
        """Read what the master sent and act on each whole packet; False once the
        control connection is closed (by the master, or by a refusal)."""
        try:
            chunk = self._sock.recv(65536)
        except BlockingIOError:
            return True
        except socket.timeout:
            raise
        except OSError:   # the master went away
            chunk = b""
        self._buffer += chunk
        while len(self._buffer) >= 4:
            (size,) = struct.unpack_from(">I", self._buffer)
            if len(self._buffer) < 4 + size:
                break
            packet, self._buffer = self._buffer[4:4 + size], self._buffer[4 + size:]
            self._take(packet)
        if not chunk and self._sock is not None:
            self._sock.close()
            self._sock = None
        return self._sock is not None

    def _take(self, packet: bytes) -> None:
        kind = struct.unpack_from(">I", packet)[0]
        if kind == HELLO and struct.unpack_from(">I", packet, 4)[0] != VERSION:
            self._refuse(f"the master speaks mux protocol {struct.unpack_from('>I', packet, 4)[0]},"
                         f" not {VERSION}")
        elif kind in (S_PERMISSION_DENIED, S_FAILURE):
            (size,) = struct.unpack_from(">I", packet, 8)
            self._refuse("the master refused the session: "
                         + packet[12:12 + size].decode("utf-8", "replace"))
        elif kind == S_EXIT_MESSAGE:
            self._status = struct.unpack_from(">I", packet, 8)[0]
        # the hello, the session opened, a tty's failure: nothing to do

    def _ended(self) -> None:
        self.kill()
        self.returncode = LOST if self._status is None else self._status

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit status, once the master closed the control connection (it does
        after the status; leaving first would cut the output short)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._sock is not None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._sock.settimeout(left)
            try:
                self._feed()
            except socket.timeout:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        self._ended()
        return self.returncode

    def communicate(self, input: Optional[bytes] = None,
                    timeout: Optional[float] = None) -> Tuple[bytes, bytes]:
        """Write ``input``, read both outputs to their end and wait for the status,
        all at once (as Popen.communicate); subprocess.TimeoutExpired past ``timeout``,
        leaving the session as it is (``kill`` leaves it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        view = memoryview(input or b"")
        with selectors.DefaultSelector() as selector:
            for stream in (self.stdout, self.stderr):
                if not stream.closed:
                    selector.register(stream, selectors.EVENT_READ)
            if self.stdin is not None and not self.stdin.closed:
                if view and self._sock is not None:
                    os.set_blocking(self.stdin.fileno(), False)
                    selector.register(self.stdin, selectors.EVENT_WRITE)
                else:
                    self.stdin.close()
            if self._sock is not None:
                self._sock.setblocking(False)
                selector.register(self._sock, selectors.EVENT_READ)
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                for key, _ in selector.select(left):
                    view = self._serve(selector, key.fileobj, view)
        self._ended()
        out, err = self.output_so_far()
        return out, err + self._refused.encode()

    def _serve(self, selector, stream, view: memoryview) -> memoryview:
        if stream is self._sock:
            if not self._feed():
                selector.unregister(stream)
        elif stream is self.stdin:
            try:
                view = view[os.write(stream.fileno(), view[:65536]):]
            except BrokenPipeError:
                view = view[:0]
            if not view:
                selector.unregister(stream)
                stream.close()
        else:
            data = os.read(stream.fileno(), 65536)
            if data:
                self._read[stream].append(data)
            else:
                selector.unregister(stream)
                stream.close()
        return view

    def kill(self) -> None:
        """Leave the session, as a killed `ssh` client does: the master closes the
        command's stdin and stdout. Its stderr stays open until the command ends on the
        host (a master closes a session only then): the caller ends its process group
        there (the start marker in ``output_so_far`` names it)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.returncode is None:
            self.returncode = LOST if self._status is None else self._status

    def output_so_far(self) -> Tuple[bytes, bytes]:
        """What stdout and stderr have given up to now, without waiting for more (kept
        for ``communicate``)."""
        for stream in (self.stdout, self.stderr):
            if stream.closed:
                continue
            os.set_blocking(stream.fileno(), False)
            try:
                while True:
                    data = os.read(stream.fileno(), 65536)
                    if not data:
                        stream.close()
                        break
                    self._read[stream].append(data)
            except BlockingIOError:
                os.set_blocking(stream.fileno(), True)
        return b"".join(self._read[self.stdout]), b"".join(self._read[self.stderr])

    def close(self) -> None:
        """Leave the session and close every pipe of ours."""
        self.kill()
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
