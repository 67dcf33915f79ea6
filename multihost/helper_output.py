"""A helper's output as the controller reads it: after the marker line that the command
line prints once the host's login shell has run it, so whatever the shell printed first
(``echo Welcome`` in .bashrc) is dropped. The marker must come within
MULTIHOST_HELPER_START seconds and after at most MAX_NOISE bytes: a host's shell can
neither hang a reader nor fill the controller's memory (helper.py starts the helper)."""
from __future__ import annotations

import socket
from typing import Optional

from . import waits
from .errors import CommandTimeout, RemoteError
from .transport import Process
from .transport.base import login_shell_ended as shell_ended

MARKER = b"=multihost-helper-output="
MAX_NOISE = 1 << 20


def after_marker(stdout: bytes) -> bytes:
    """What the helper wrote: the output after the marker line (b"" when the shell ended
    before our command ran, whatever it printed)."""
    head, found, rest = stdout.partition(b"\n" + MARKER + b"\n")
    if found:
        return rest
    return stdout[len(MARKER) + 1:] if stdout.startswith(MARKER + b"\n") else b""


class HelperOutput:
    """A helper stream's stdout from the helper's first byte on: on the first read,
    what the host's shell printed before the marker is read and dropped, under a
    deadline (a shell that never runs our command) and a size limit."""

    def __init__(self, process: Process, label: str, login: str = "ssh HOST",
                 first_line_within: Optional[float] = None, python: str = "python3"):
        self._process = process
        self._raw = process.stdout
        self._label = label
        self._login = login
        self._started = False
        # For an op whose helper says something at once: its first line must come in
        # time, or the interpreter hangs while starting (it is then ended, group and all).
        self._first_line_within = first_line_within
        self._python = python

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        own_deadline = self._process.read_timeout is None
        within = waits.helper_start()
        if own_deadline:
            self._process.set_timeout(within)
        dropped = 0
        try:
            while True:
                line = self._raw.readline(MAX_NOISE + 1)
                if not line:
                    self._shell_ended()
                    return
                if line == MARKER + b"\n":
                    return
                dropped += len(line)
                if dropped > MAX_NOISE:
                    raise RemoteError(
                        f"the login shell printed over {MAX_NOISE >> 20} MiB before the "
                        "multihost helper started", host=self._label,
                        fix="make the shell's start-up files (~/.bashrc) quiet for "
                            "non-interactive ssh commands")
        except socket.timeout:
            raise CommandTimeout(
                f"the helper did not start within {within:.0f}s: the login "
                "shell's start-up files may wait for input or hang", host=self._label,
                fix=f"check that `{self._login} true` returns at once; make ~/.bashrc "
                    "return early for non-interactive shells") from None
        finally:
            if own_deadline:
                self._process.set_timeout(None)

    def _shell_ended(self) -> None:
        """EOF before the marker: the login shell ended before our command line ran
        (unless we closed the stream ourselves: then there is no exit status to read)."""
        try:
            code = self._process.wait(2.0)
        except (CommandTimeout, OSError, ValueError, AttributeError):
            return
        raise login_shell_ended(self._label, code, self._login)

    def started(self) -> None:
        """Wait until the host's shell runs our command (its marker line): the host
        answers, whatever its helper then takes to say something."""
        self._start()

    def read(self, size: Optional[int] = None) -> bytes:
        self._start()
        return self._raw.read() if size is None or size < 0 else self._raw.read(size)

    def readline(self, size: Optional[int] = None) -> bytes:
        self._start()
        within, self._first_line_within = self._first_line_within, None
        if within is not None and self._process.read_timeout is None:
            self._process.set_timeout(within)
            try:
                return self._raw.readline() if size is None or size < 0 else self._raw.readline(size)
            except socket.timeout:
                self._process.end_group()
                raise CommandTimeout(
                    f"the multihost helper did not start within {within:.0f}s: {self._python} "
                    "hangs while starting", host=self._label,
                    fix=f"try `{self._login} {self._python} -c pass` there (a hung file system, "
                        "a broken module?); give a working python3 with --python") from None
            finally:
                if self._process.stdout is not None:
                    self._process.set_timeout(None)
        return self._raw.readline() if size is None or size < 0 else self._raw.readline(size)

    def __iter__(self):
        return iter(self.readline, b"")

    def close(self) -> None:
        self._raw.close()


def login_shell_ended(label: str, code: int, login: str) -> RemoteError:
    return shell_ended(label, "the multihost helper", code, login)
