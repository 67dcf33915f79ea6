"""One command in a fork of the warm controller: becomes the process the client would
have been (its terminal, directory, environment, umask, arguments), runs the CLI, and
ends with its status.

The fork already holds every module the server loaded; what must not carry over from the
server does not: its listening socket and other clients' connections are closed, the
signal handlers are Python's defaults again, and the standard streams are made afresh
on the client's descriptors (a terminal gets line buffering, as at any start-up).
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import traceback

from .. import afterwards
from . import wire


def become(conn, fds: list, argv: list, cwd: str, environ: dict, umask: int,
           inherited: list) -> None:
    """Run the command and exit; never returns."""
    server = os.getppid()
    for fd in inherited:
        try:
            os.close(fd)
        except OSError:
            pass
    os.setpgid(0, 0)  # the group the client's signals go to: this and its children
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    fds.clear()
    os.umask(umask)
    os.environ.clear()
    os.environ.update(environ)
    sys.argv = list(argv)
    _fresh_streams()
    finished = threading.Event()
    threading.Thread(target=_signals_from, args=(conn, finished), daemon=True).start()
    afterwards.collect()
    code = _run(argv[1:], cwd)
    finished.set()
    if afterwards.pending():
        _answer_early(conn, code)
        afterwards.run_deferred()
    # The server reports the end once this process is reaped (after it has logged it: the
    # client returns when the command is over, not just about to be). A server gone
    # meanwhile cannot: then this says it itself.
    if os.getppid() != server:
        try:
            conn.sendall(wire.frame(wire.EXITED, code))
        except OSError:
            pass
    os._exit(code)


def _answer_early(conn, code: int) -> None:
    """The command is over and its output flushed: give the client its status now,
    before the work that only speeds up a later command (afterwards.py). The client's
    descriptors are let go first, so that whoever reads its output sees the end with
    the status; the server's own report, after this process ends, then finds the
    client gone, which it ignores."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    try:
        conn.sendall(wire.frame(wire.EXITED, code))
    except OSError:
        pass  # then the server's report, once this process has ended


def _fresh_streams() -> None:
    """sys.stdin/stdout/stderr on descriptors 0-2, buffered as Python buffers them at
    start-up, in the encoding the server started with (the key holds what decides it)."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        old = getattr(sys, "__%s__" % name) or getattr(sys, name)
        stream = open(fd, mode, buffering=1 if name == "stderr" else -1, closefd=False,
                      encoding=getattr(old, "encoding", None),
                      errors=getattr(old, "errors", None))
        setattr(sys, name, stream)
        setattr(sys, "__%s__" % name, stream)


def _run(args: list, cwd: str) -> int:
    """The CLI's main, ended as the cold `multihost` ends (cli.finish): streams flushed,
    threads joined, exit hooks run; a traceback only for what would have printed one."""
    from ..cli import EXIT_CLOSED_PIPE, main, silence_stdout

    try:
        os.chdir(cwd)
        code = main(args)
    except SystemExit as stop:  # argparse's --help and --version, sys.exit() anywhere
        code = _exit_code(stop.code)
    except OSError as err:
        if err.filename != cwd:
            raise
        print(f"multihost: the working directory {cwd} is gone ({err.strerror}) "
              "(fix: cd to an existing directory)", file=sys.stderr)
        code = 1
    except BaseException:  # noqa: BLE001 (as the interpreter would: printed, status 1)
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        silence_stdout()
        code = EXIT_CLOSED_PIPE
    except (OSError, ValueError):
        pass
    return code


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _signals_from(conn, finished: threading.Event) -> None:
    """Deliver the client's signals to this command's process group; the client gone
    before the command ended is a hang-up, as a closed terminal's."""
    while True:
        frame = wire.read_frame(conn)
        if frame is None:
            if not finished.is_set():
                os.killpg(0, signal.SIGHUP)
            return
        kind, number = frame
        if kind == wire.SIGNAL and 0 < number < signal.NSIG:
            try:
                os.killpg(0, number)
            except OSError:
                pass
