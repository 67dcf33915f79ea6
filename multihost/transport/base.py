"""The transport interface: run a command on one host, or start one and stream it.

Two implementations share it: SSH (``ssh.py``, the only module that imports paramiko)
and local (``local.py``, for a host that is this machine). Commands are either an argv
list, which is quoted with ``shlex`` so no element is ever re-parsed by a shell, or a
string, which is a shell command line on purpose (``multihost exec -- 'cmd | grep x'``).

A broken stream is one error type, whatever the transport underneath: what a started
command's ``stdin`` raises is a ``BrokenStream`` (paramiko's and the pipes' own errors are
translated here, at the edge), so nothing above the transport catches ``Exception``.
"""
from __future__ import annotations

import base64
import contextlib
import shlex
import signal
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import IO, Optional, Sequence, Tuple, Type, Union

from ..hosts import Host

Command = Union[str, Sequence[str]]


def to_shell(command: Command, cwd: Optional[str] = None) -> str:
    """The one place a command becomes a shell line: argv is quoted element by element."""
    line = command if isinstance(command, str) else shlex.join(command)
    if cwd:
        line = f"cd {quote_path(cwd)} && {line}"
    return line


# The first thing a remote command line does: say, on stderr, that the login shell got as
# far as our command, and the shell's pid, which leads the process group of everything
# the command starts (sshd starts the shell in a session of its own). A command that
# gives up on a host ends that group (``kill_group_line``): a python hung on an NFS
# stall is not left behind. No marker at all: the login shell ended before our command.
START = b"=multihost-start="
# What every login shell passes through unchanged inside single quotes: bash, dash and
# zsh take anything but a quote; fish also reads backslash escapes there, and tcsh ends
# at a newline and may read `!` as a history reference.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                   " \t\"#$%&()*+,-./:;<=>?@[]^_`{|}~")


def remote_line(line: str) -> str:
    """The line sshd hands to the user's login shell, whichever it is (bash, dash, zsh,
    tcsh, fish): our commands are POSIX shell, so the login shell only starts `sh` with
    them, in its place (`exec`: its pid leads the process group, as before). A line with
    a character some login shell would read inside quotes travels base64-encoded."""
    posix = f"echo >&2; echo {START.decode()} $$ >&2; {line}"
    if _PLAIN.issuperset(posix):
        return f"exec sh -c '{posix}'"
    encoded = base64.b64encode(posix.encode("utf-8", "surrogateescape")).decode()
    return f"exec sh -c 'eval \"$(echo {encoded} | base64 -d)\"'"


def split_start(stderr: bytes) -> Tuple[Optional[int], bool, bytes]:
    """(the shell's pid, whether the marker came, stderr without the marker line)."""
    head, found, rest = stderr.partition(b"\n" + START + b" ")
    if not found:
        return None, False, stderr
    pid, _, tail = rest.partition(b"\n")
    return (int(pid) if pid.isdigit() else None), True, head + tail


def kill_group_line(pid: int) -> str:
    """The POSIX shell line that ends process group ``pid`` (for ``remote_line``). Not
    `kill -TERM -- -PID`: dash, Debian's sh, takes `--` for a pid and kills nothing."""
    return (f"kill -TERM -{pid} 2>/dev/null; sleep 1; kill -KILL -{pid} 2>/dev/null; "
            "exit 0")


def judge_start(result: "CommandResult", label: str, login: str) -> "CommandResult":
    """The result without the start marker; a RemoteError when the marker never came (the
    login shell ended before our command ran: its exit status is not the command's).
    Exit 255 is the ssh client's own failure, left to its caller."""
    _, found, stderr = split_start(result.stderr)
    if not found and result.exit_code != 255:
        raise login_shell_ended(label, "the command", result.exit_code, login)
    return CommandResult(result.host, result.command, result.exit_code, result.stdout, stderr,
                         result.duration)


def login_shell_ended(label: str, what: str, code: int, login: str) -> "Exception":
    """The error for a command line the login shell never ran. Every login shell is
    given the same line (remote_line), so what is left is the shell's own start-up:
    a file that ends non-interactive shells, or an account without a shell."""
    from ..errors import RemoteError

    return RemoteError(
        f"the login shell ended before {what} ran (exit status {code}): a start-up file "
        "ends non-interactive shells, or the account has no login shell", host=label,
        fix=f"`{login} true; echo $?` must print 0: a start-up file (~/.bashrc, ~/.zshenv, "
            "~/.cshrc, ~/.config/fish/config.fish) must return early for non-interactive "
            "shells, not exit; the account's shell (`getent passwd $USER`) must be a real one")


def quote_path(path: str) -> str:
    """Quote a remote path, keeping a leading ``~/`` expandable by the remote shell."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


@dataclass(frozen=True)
class SshOptions:
    """How to connect; the same for every host of a command."""

    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False
    config_file: str = "~/.ssh/config"
    keepalive: int = 5


@dataclass(frozen=True)
class CommandResult:
    host: str
    command: str
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


class BrokenStream(OSError):
    """The other end of a started command's input is gone: the command exited without
    reading it, the connection dropped, or the channel was closed. The one error a
    ``Process.stdin`` raises, over every transport. An OSError, as a failed write always
    was: code that treats a write failure as one keeps doing so."""


class InputStream:
    """A started command's stdin: ``write``, ``flush``, and ``close``, which sends
    end-of-file once (a second close does nothing). Every failure of the stream
    underneath (the transport's ``errors``) is raised as a ``BrokenStream`` naming it."""

    errors: Tuple[Type[BaseException], ...] = (OSError, ValueError)

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self._ended = False

    def write(self, data: bytes) -> None:
        try:
            self._raw.write(data)
        except self.errors as exc:
            raise _broken(exc) from None

    def flush(self) -> None:
        try:
            self._raw.flush()
        except self.errors as exc:
            raise _broken(exc) from None

    def close(self) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            self._end()
        except self.errors as exc:
            raise _broken(exc) from None

    def _end(self) -> None:
        """Send end-of-file (a pipe: close it)."""
        self._raw.close()


def _broken(exc: BaseException) -> BrokenStream:
    return BrokenStream(str(exc) or type(exc).__name__)


class Process(ABC):
    """A command started on a host whose output is read as it comes."""

    stdout: IO[bytes]
    stdin: InputStream
    read_timeout: Optional[float] = None  # what set_timeout last set

    @abstractmethod
    def read_stderr(self) -> bytes:
        """Everything the command wrote to stderr (call after stdout reached EOF)."""

    @abstractmethod
    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit status (waits); raises CommandTimeout when it does not come in time."""

    @abstractmethod
    def close(self) -> None:
        """Stop reading. Over SSH this closes the channel; the remote command may live on."""

    def kill(self) -> None:
        """Stop the command now (a reply that does not come in time): a local process is
        killed (an `ssh` client's remote command then gets a hangup); over SSH the
        channel is closed."""
        self.close()

    def end_group(self) -> None:
        """End the command's process group where it runs, leaving the streams to the
        caller (they then reach their end as for any command that exited)."""

    def set_timeout(self, seconds: Optional[float]) -> None:
        """Make a read that waits longer than this raise ``socket.timeout`` (an OSError),
        so a dead link is noticed; locally a pipe cannot go silent that way."""


class Transport(ABC):
    host: Host
    is_local: bool = False

    @abstractmethod
    def run(self, command: Command, *, input: Optional[bytes] = None,
            timeout: Optional[float] = None, cwd: Optional[str] = None) -> CommandResult:
        """Run to completion; stdout and stderr are collected. Never raises on exit status."""

    @abstractmethod
    def start(self, command: Command, *, cwd: Optional[str] = None) -> Process:
        """Start a command and return it running, with its streams."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection. Safe to call twice."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def pipe_errors_raise():
    """While streams are written: a write to a reader that died must raise (and be
    reported as that host's failure), not end multihost. The CLI gives SIGPIPE its default
    action so that `multihost logs | head` exits quietly; during a sync that would kill
    the controller silently the moment one `ssh` or host went away."""
    if not hasattr(signal, "SIGPIPE") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGPIPE, previous)
