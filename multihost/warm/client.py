"""The ``multihost`` command's first step: hand the command to a warm controller, if one
is up for this key, else run it here and leave one behind.

What the user sees is the same either way: the command runs on this terminal (its
standard input, output and error are passed over the socket, the descriptors
themselves), in this directory, with this environment and umask, and this process exits
with its status or dies of its signal. Signals sent here (Ctrl-C, a `kill`, a hang-up,
Ctrl-Z and `fg`) reach the command's whole process group, as the terminal's would have.

Nothing here may cost more than a few milliseconds or ever lose a command: until the
server says it has started the command, any failure (no server, a stale one, a refusal,
a broken socket) means running it here, cold, exactly as without a warm controller.
"""
from __future__ import annotations

import _signal
import _socket
import os
import sys

from . import wire

# Ctrl-Z stops the command's group and then this process, as the shell expects; the
# rest are passed on as they are.
_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH",
              "SIGCONT", "SIGTSTP")
_REQUEST_WAIT = 5.0  # seconds for a server to take the request, or the command runs here


def run() -> None:
    """The entry point of the ``multihost`` script and of ``python -m multihost``."""
    argv = sys.argv[1:]
    place = None
    if wire.served_warm(argv):
        place = wire.place_for(os.environ)
    if place is not None:
        status = served(place)
        if status is not None:
            exit_as(status)
    from ..cli import finish, main

    try:
        code = main()
    finally:  # also after argparse's exits (--help, a bad flag): the next one is warm
        if place is not None:
            from .server import start_server

            start_server()
    finish(code)


def served(place: wire.Place) -> tuple[bytes, int] | None:
    """The command's end (EXITED and a code, or KILLED and a signal) as run by the warm
    controller; None when it did not start it (the caller runs it here)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    before = {}
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)  # a closed descriptor cannot be passed: run here
        sock.settimeout(_REQUEST_WAIT)
        sock.connect(place.socket)
        umask = os.umask(0o022)
        os.umask(umask)
        request = wire.encode_request(place.key, sys.argv, os.getcwd(), dict(os.environ), umask)
        sock.sendmsg([request], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                                  b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2)))])
        if wire.recv_exactly(sock, wire.FRAME)[:1] != wire.READY:
            return None
        before = _forward_signals(sock)
        sock.sendall(wire.frame(wire.GO))
    except OSError:
        for number, handler in before.items():  # the command runs here: as it would
            _signal.signal(number, handler)
        sock.close()
        return None
    # From here on the command is the server's: wait for its end, however long.
    sock.settimeout(None)
    while True:
        frame = wire.read_frame(sock)
        if frame is None:
            # Both the server and the command are gone without a word: say so, never a
            # silent success.
            os.write(2, b"multihost: the warm controller ended before the command's exit "
                        b"status came (fix: run the command again; MULTIHOST_WARM=0 runs "
                        b"it without one)\n")
            return wire.EXITED, 1
        if frame[0] in (wire.EXITED, wire.KILLED):
            return frame


def _forward_signals(sock) -> dict:
    """Pass this process's signals on to the command; the handlers they had."""
    def forward(signum, _frame):
        try:
            if signum == _signal.SIGTSTP:
                sock.sendall(wire.frame(wire.SIGNAL, _signal.SIGSTOP))
                os.kill(os.getpid(), _signal.SIGSTOP)
            else:
                sock.sendall(wire.frame(wire.SIGNAL, signum))
        except OSError:
            pass

    before = {}
    for name in _FORWARDED:
        number = getattr(_signal, name, None)
        # One this process ignores (a background job's SIGINT, nohup's SIGHUP) the
        # command would have ignored too.
        if number is not None and _signal.getsignal(number) != _signal.SIG_IGN:
            before[number] = _signal.signal(number, forward)
    return before


def exit_as(status: tuple[bytes, int]) -> None:
    """Exit with the command's code, or die of its signal as a shell expects."""
    kind, number = status
    if kind == wire.KILLED:
        try:
            _signal.signal(number, _signal.SIG_DFL)
            os.kill(os.getpid(), number)
        except (OSError, ValueError):
            pass
        os._exit(128 + number)
    os._exit(number & 0xFF)
