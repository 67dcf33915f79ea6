"""A command run through a master by the controller itself (mux_client.py), looking to
its caller exactly as the `ssh` client process it replaces (local.LocalProcess): pipes
for stdin, stdout and stderr, ``wait``, ``kill``, ``close``, and ``run``'s result.

The three pipes are made here; the master gets the command's ends (it reads the stdin
pipe into the SSH channel and writes the channel's output into the others), this
process keeps its own ends, the same ones a Popen of `ssh` would have given.
"""
from __future__ import annotations

import os
import selectors
import signal
import socket
import time
from typing import Optional, Tuple

from ..errors import CommandTimeout
from .base import InputStream, Process
from .mux_client import MuxRefused, MuxSession

CHUNK = 65536


def start_through(path: str, line: str, timeout: float, label: str) -> "MuxProcess":
    """``line`` running on the host through the master at ``path``; MuxRefused when the
    master opened no session within ``timeout`` seconds (the caller goes another way)."""
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    try:
        session = MuxSession.open(path, os.fsencode(line), (stdin_r, stdout_w, stderr_w),
                                  timeout)
    except MuxRefused:
        for fd in (stdin_w, stdout_r, stderr_r):
            os.close(fd)
        raise
    finally:  # the master holds its own copies now (or none was wanted)
        for fd in (stdin_r, stdout_w, stderr_w):
            os.close(fd)
    return MuxProcess(session, stdin_w, stdout_r, stderr_r, label)


class MuxProcess(Process):
    def __init__(self, session: MuxSession, stdin_fd: int, stdout_fd: int, stderr_fd: int,
                 label: str):
        self._session = session
        self._label = label
        self._stdin_raw = os.fdopen(stdin_fd, "wb")
        self.stdin = InputStream(self._stdin_raw)
        self.stdout = os.fdopen(stdout_fd, "rb")
        self._stderr = os.fdopen(stderr_fd, "rb")
        self._killed = False

    def read_stderr(self) -> bytes:
        return self._stderr.read()

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            code = self._session.wait(deadline)
        except socket.timeout:
            raise CommandTimeout(f"command still running after {timeout:.0f}s",
                                 host=self._label) from None
        if self._killed and self._session.exit_status is None:
            return -signal.SIGKILL   # what the killed `ssh` client's wait gave
        return code

    def kill(self) -> None:
        """As killing the `ssh` client did: the session ends, the master closes its
        channel (the remote command gets a hangup of its input and output)."""
        if not self._session.ended:
            self._killed = True
            self._session.end()

    def close(self) -> None:
        for stream in (self._stdin_raw, self.stdout, self._stderr):
            try:
                stream.close()
            except OSError:  # stdin of a command that exited without reading it
                pass
        if self._session.ended or self._session.exit_status is not None:
            self._session.close()
        # else the session lives on with its input and output closed, as an `ssh`
        # client left running did; its socket goes with this object

    def __del__(self) -> None:
        try:
            self._session.close()
        except Exception:  # interpreter exit: nothing left to tidy
            pass

    def communicate(self, data: Optional[bytes], timeout: Optional[float]) -> Tuple[bytes, bytes, int]:
        """``data`` to stdin while stdout and stderr are read to their ends, then the exit
        status, as subprocess.run does; CommandTimeout (the session ended) past ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            out, err = self._pump(data or b"", deadline)
            code = self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except CommandTimeout:
            self.kill()
            self.close()
            raise
        self.close()
        return out, err, code

    def _pump(self, data: bytes, deadline: Optional[float]) -> Tuple[bytes, bytes]:
        chunks = {self.stdout.fileno(): [], self._stderr.fileno(): []}
        pending = memoryview(data)
        stdin_fd = self._stdin_raw.fileno()
        with selectors.DefaultSelector() as selector:
            for fd in chunks:
                selector.register(fd, selectors.EVENT_READ)
            if pending:
                os.set_blocking(stdin_fd, False)
                selector.register(stdin_fd, selectors.EVENT_WRITE)
            else:
                self._stdin_raw.close()
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise CommandTimeout("timed out", host=self._label)
                for key, _ in selector.select(left):
                    if key.fd == stdin_fd:
                        try:
                            pending = pending[os.write(stdin_fd, pending[:CHUNK]):]
                        except BlockingIOError:
                            continue
                        except OSError:  # the command stopped reading: as subprocess.run
                            pending = pending[:0]
                        if not pending:
                            selector.unregister(stdin_fd)
                            self._stdin_raw.close()
                    else:
                        chunk = os.read(key.fd, CHUNK)
                        if chunk:
                            chunks[key.fd].append(chunk)
                        else:
                            selector.unregister(key.fd)
        return b"".join(chunks[self.stdout.fileno()]), b"".join(chunks[self._stderr.fileno()])
