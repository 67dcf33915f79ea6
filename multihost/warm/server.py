"""The warm controller: a process with multihost's modules loaded that forks a copy of
itself for each command, as OpenSSH's ControlPersist keeps a connection.

A command that finds nothing to do is mostly start-up: the interpreter, then 80-100 ms
of imports (argparse, dataclasses, typing, subprocess, the sync's modules) before the
first host is asked anything, where rsync, a C program, starts in a millisecond. The
first eligible command (wire.COMMANDS) runs cold and then starts this server, detached,
telling it which modules it used; each later command's client passes its terminal,
directory and environment over a private unix socket, and the command runs in a fork of
this process with everything already imported (worker.py).

It lives as long as the OpenSSH masters do (MULTIHOST_CONTROL_PERSIST idle seconds, 600
by default; 0, or MULTIHOST_WARM=0, means none), never while a command it started still
runs, and ends on its own when a file it loaded changes (an upgrade, an edit of an
editable install: the next command runs cold and starts a fresh one; multihost's own
files are looked at before every command, the libraries' when it is idle), when its
socket is removed or replaced, or on SIGTERM. Only its own user, in its own namespaces, is
served; anything wrong with a request is a refusal, and the client runs the command
itself.
"""
from __future__ import annotations

import fcntl
import gc
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time

from . import wire
from .worker import become

_TICK = 5.0          # seconds between looks at the socket, the files and the idle time
_REQUEST_WAIT = 2.0  # a client that connects and says nothing holds the server this long
_LOCK_WAIT = 3.0     # for a stale server still on its way out
_MAX_REQUEST = 1 << 22
_LOG_SIZE = 1 << 18  # then the log starts again, the last one kept as .log.1


def start_server() -> None:
    """Start a warm controller for this process's key, detached (its own session, no
    terminal, working directory /), given the modules this command imported. Never
    fails the command that starts it."""
    import subprocess

    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    boot = ("import sys; sys.path[0] = %r; from multihost.warm.server import serve; serve()"
            % package_parent)
    modules = "\n".join(name for name, module in list(sys.modules.items())
                        if module is not None and name != "__main__")
    try:
        server = subprocess.Popen(
            [sys.executable, "-c", boot], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd="/", start_new_session=True)
        server.stdin.write(modules.encode())
        server.stdin.close()
    except OSError:
        pass


def serve() -> None:
    """The server's main: take the lock, load, listen, serve until idle or stale."""
    modules = sys.stdin.read().split()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the pipe's writer is long gone; hold nothing of it
    os.close(devnull)
    place = wire.place_for(os.environ)
    persist = wire.persist_seconds(os.environ)
    if place is None or persist is None:
        return
    lock = _locked(place.lock_file)
    if lock is None:
        return  # another server has this key
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 (a module the command had is only a speed-up here)
            pass
    _one_malloc_arena()
    listener = _listen(place.socket)
    with open(place.pid_file, "w") as out:
        out.write(f"{os.getpid()}\n")
    Server(place, listener, persist, lock).loop()
    try:
        os.unlink(place.log_file)  # what it ran goes with it
    except OSError:
        pass


def _one_malloc_arena() -> None:
    """One malloc arena for every thread of a command. A sync starts a dozen threads,
    and glibc gives each its own arena: in a fork, every page of each fresh arena is a
    page fault, about a quarter of a one-file sync's (5,000 at 4 hosts, 3,900 with one
    arena; each costs a few microseconds); the threads take turns at the GIL anyway. A
    libc without it is left as it is."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-8, 1)   # M_ARENA_MAX (glibc's malloc.h)
    except (ImportError, OSError, AttributeError):
        pass


def _locked(path: str):
    """The lock file's descriptor, held; None if another server holds it still."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    deadline = time.monotonic() + _LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def _listen(path: str) -> socket.socket:
    """Bind under a temporary name and rename it into place: a client never finds a path
    with nothing behind it, and a dead server's socket is replaced in one step."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    temporary = f"{path}.{os.getpid()}"
    listener.bind(temporary)
    os.chmod(temporary, 0o600)
    os.rename(temporary, path)
    listener.listen(64)
    return listener


def _files_loaded() -> dict:
    """Every file behind a loaded module, as it is now: any change means stale."""
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path not in files:
            files[path] = _identity(path)
    return files


def _identity(path: str):
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


class Server:
    def __init__(self, place: wire.Place, listener: socket.socket, persist: int, lock: int):
        self.place, self.listener, self.persist, self.lock = place, listener, persist, lock
        self.socket_identity = _identity(place.socket)
        # multihost's own files are looked at before every command (an upgrade, an edit
        # of an editable install); every other loaded file (the libraries, Python's own)
        # at every tick, as 500 `stat`s would cost each command 2 ms.
        self.files = _files_loaded()
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
        self.own_files = {path: identity for path, identity in self.files.items()
                          if os.path.abspath(path).startswith(package)}
        self.commands: dict = {}  # pid -> the client's connection, for the command's end
        self.served: dict = {}    # pid -> (command word, this server's CPU in starting it)
        self.idle_since = time.monotonic()
        self.wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: None)  # wakes the loop, which ends
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.ending = False  # set by SIGTERM or a stale request
        # What the forks share stays out of the collector's reach: no copy-on-write of
        # every object the first time a child collects.
        gc.collect()
        gc.freeze()

    def loop(self) -> None:
        try:
            while self.listener is not None or self.commands:
                waiting = [self.wake_read]
                if self.listener is not None:
                    waiting.append(self.listener)
                ready, _, _ = select.select(waiting, [], [], _TICK)
                if self.wake_read in ready:
                    self._woken()
                self._reap()
                if self.listener is not None and self.listener in ready:
                    self._accept()
                if self.listener is not None and (self.ending or self._should_end(not ready)):
                    # Ending, the commands still running aside: a new client must find
                    # no socket (and run cold) rather than wait in the backlog.
                    self._leave()
        finally:
            self._leave()

    def _woken(self) -> None:
        signals = os.read(self.wake_read, 512)
        if signal.SIGTERM in signals:
            self.ending = True

    def _should_end(self, idle_tick: bool) -> bool:
        if self.commands:
            self.idle_since = time.monotonic()
            return False
        return (time.monotonic() - self.idle_since > self.persist
                or _identity(self.place.socket) != self.socket_identity
                or (idle_tick and _changed(self.files)))

    def _leave(self) -> None:
        if self.listener is None:
            return
        self.listener.close()
        self.listener = None
        # A fresh server may start while these commands finish. The lock file goes too,
        # or every key ever used (a lab's namespace is one) would leave one: a server that
        # took the old file's lock meanwhile and one on a new file would both listen,
        # and the one whose socket is replaced ends at its next tick.
        for path in (self.place.lock_file, self.place.log_file + ".1"):
            try:
                os.unlink(path)
            except OSError:
                pass
        os.close(self.lock)
        if _identity(self.place.socket) == self.socket_identity:
            for path in (self.place.socket, self.place.pid_file):
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def _reap(self) -> None:
        while self.commands:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.commands.pop(pid, None)
            if conn is None:
                continue
            self._log(pid, status, usage)
            if os.WIFSIGNALED(status):
                end = wire.frame(wire.KILLED, os.WTERMSIG(status))
            else:
                end = wire.frame(wire.EXITED, os.waitstatus_to_exitcode(status))
            try:
                conn.sendall(end)
            except OSError:
                pass
            conn.close()
            self.idle_since = time.monotonic()

    def _log(self, pid: int, status: int, usage) -> None:
        """A line for each command served: what, its status, and the CPU and peak memory
        it cost (the fork with every process it waited for, and this server's share),
        so that a warm command's cost is not hidden from whoever measures it."""
        command, server_cpu = self.served.pop(pid, ("?", 0.0))
        line = {"time": round(time.time(), 3), "pid": pid, "command": command,
                "status": os.waitstatus_to_exitcode(status),
                "cpu": round(usage.ru_utime + usage.ru_stime, 4),
                "server_cpu": round(server_cpu, 4), "peak_mib": round(usage.ru_maxrss / 1024, 1),
                "page_faults": usage.ru_minflt}
        try:
            if os.path.getsize(self.place.log_file) > _LOG_SIZE:
                os.replace(self.place.log_file, self.place.log_file + ".1")
        except OSError:
            pass
        try:
            with open(self.place.log_file, "a") as log:
                log.write(json.dumps(line) + "\n")
        except OSError:
            pass

    def _accept(self) -> None:
        started = time.process_time()
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        fds: list = []
        try:
            conn.settimeout(_REQUEST_WAIT)
            request, fds = _read_request(conn)
            if request is None or request[0] != self.place.key or not _same_user(conn):
                conn.sendall(wire.frame(wire.REFUSED))
                return
            if _changed(self.own_files):
                conn.sendall(wire.frame(wire.REFUSED))
                self.ending = True
                return
            conn.sendall(wire.frame(wire.READY))
            if wire.recv_exactly(conn, wire.FRAME)[:1] != wire.GO:
                return
            conn.settimeout(None)
            pid = self._fork(conn, fds, request)
            conn = None  # the command's now
            self.served[pid] = (wire.command_word(request[1][1:]) or "?",
                                time.process_time() - started)
        except OSError:
            pass
        finally:
            for fd in fds:
                os.close(fd)
            if conn is not None:
                conn.close()

    def _fork(self, conn: socket.socket, fds: list, request) -> int:
        _key, argv, cwd, environ, umask = request
        pid = os.fork()
        if pid == 0:
            try:
                inherited = [self.listener.fileno(), self.wake_read, self.lock,
                             *(other.fileno() for other in self.commands.values())]
                become(conn, fds, argv, cwd, environ, umask, inherited)
            finally:
                os._exit(70)
        self.commands[pid] = conn
        try:
            conn.sendall(wire.frame(wire.STARTED, pid))
        except OSError:
            pass
        return pid


def _read_request(conn: socket.socket):
    """The request and the three descriptors that came with it."""
    data, ancillary, _flags, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
    fds = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(payload) // 4}i", payload[:len(payload) // 4 * 4])
    if len(data) < 4 or len(fds) != 3:
        return None, fds
    size = int.from_bytes(data[:4], "big")
    if size > _MAX_REQUEST:
        return None, fds
    body = data[4:]
    if len(body) < size:
        body += wire.recv_exactly(conn, size - len(body))
    return wire.decode_request(body), fds


def _same_user(conn: socket.socket) -> bool:
    """The client is this user, in this server's namespaces (the socket's directory is
    the user's alone; this says so again, from the kernel)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET,
                                                         socket.SO_PEERCRED, 12))
    return uid == os.getuid() and wire.namespaces(str(pid)) == wire.namespaces()


def _changed(files: dict) -> bool:
    return any(_identity(path) != identity for path, identity in files.items())
