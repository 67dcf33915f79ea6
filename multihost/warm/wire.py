"""Where a warm controller listens, who may use it, and the one codec of its socket.

Both sides import this before anything else of multihost, so it stays on the cheapest
modules there are (``_socket``, ``marshal``, ``zlib``): the client's whole point is to
cost little more than the interpreter's own start-up (``socket`` alone imports ``enum``
and ``selectors``, 6 ms; ``json`` imports ``re``).

The key names everything a process decides once, at start-up, that a later command might
see differently: multihost's version and files, the interpreter, the user, the network,
mount and pid namespaces (a controller in a lab's namespace must never serve a command
started outside it, nor one outside serve a command inside), and the environment that
Python and multihost read at import time. Two commands with the same key would have
built the same process; anything else (arguments, working directory, the rest of the
environment, umask, the terminal) travels with each request.
"""
from __future__ import annotations

import _socket
import marshal
import os
import sys
import zlib
from .. import __version__

PROTOCOL = 1
WARM_ENV = "MULTIHOST_WARM"
PERSIST_ENV = "MULTIHOST_CONTROL_PERSIST"  # the same knob as the OpenSSH masters' (openssh.py)
DEFAULT_PERSIST = 600
# The commands a warm controller runs: the short everyday ones, where start-up is most of
# the time. `run` and its kin own the terminal for hours (keys, resize, job control), and
# so does `logs --follow`; `ssh` hands it to an interactive session, `lab` needs a fresh
# root process: they start cold.
COMMANDS = frozenset({"sync", "exec", "check", "status", "logs", "stop", "stacks"})
_FOLLOW = ("-f", "--follow")
# Read at start-up by Python (its stdio encodings, paths, hash seed) or by multihost.
_START_UP_ENV = ("LANG", "HOME", "XDG_CACHE_HOME", "TMPDIR", PERSIST_ENV)
_START_UP_PREFIXES = ("PYTHON", "LC_")
_DIRS = ("~/.cache/multihost/warm", "/tmp/multihost-warm-{uid}")
_MAX_SOCKET_PATH = 96  # sun_path holds 107 bytes; the server binds a longer name first

# Frames on the socket once a request is in: a kind byte and a signed 32-bit number.
READY = b"R"      # server: the request is good, say GO to start it
GO = b"G"         # client: start it
REFUSED = b"N"    # server: not this one (stale code, another key): run cold
STARTED = b"P"    # server: the command runs, as this pid (its own process group)
EXITED = b"E"     # the command's exit status
KILLED = b"K"     # the command ended by this signal
SIGNAL = b"S"     # client: deliver this signal to the command's process group
FRAME = 5


class Place:
    """Where the warm controller for one key listens. (Not a dataclass or a NamedTuple:
    `typing` and `dataclasses` cost more than the whole client may.)"""
    __slots__ = ("key", "socket", "pid_file", "lock_file", "log_file")

    def __init__(self, key: str, base: str):
        self.key = key
        self.socket, self.pid_file, self.lock_file, self.log_file = (
            base + ".sock", base + ".pid", base + ".lock", base + ".log")


def frame(kind: bytes, number: int = 0) -> bytes:
    return kind + number.to_bytes(4, "big", signed=True)


def unframe(data: bytes) -> tuple[bytes, int]:
    return data[:1], int.from_bytes(data[1:FRAME], "big", signed=True)


def recv_exactly(sock, size: int) -> bytes:
    """``size`` bytes, or fewer if the other side closed first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def read_frame(sock) -> tuple[bytes, int] | None:
    """The next frame; None once the other side is gone (or the socket broke)."""
    try:
        data = recv_exactly(sock, FRAME)
    except OSError:
        return None
    return unframe(data) if len(data) == FRAME else None


def namespaces(pid: str = "self") -> str:
    """The process's network, mount and pid namespaces ("-" where there is no /proc)."""
    parts = []
    for kind in ("net", "mnt", "pid"):
        try:
            info = os.stat(f"/proc/{pid}/ns/{kind}")
            parts.append(f"{info.st_dev}:{info.st_ino}")
        except OSError:
            parts.append("-")
    return ",".join(parts)


def start_up_key(environ) -> str:
    """Everything that made this process what it is at start-up (see the module's doc)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    settings = sorted(f"{name}={value}" for name, value in environ.items()
                      if name in _START_UP_ENV or name.startswith(_START_UP_PREFIXES))
    return "\0".join([str(PROTOCOL), __version__, sys.executable, package,
                      str(os.getuid()), namespaces(), *settings])


def persist_seconds(environ) -> int | None:
    """How long an idle warm controller lives on; None when there is to be none (turned
    off, or a setting the command itself will refuse with its own error)."""
    if environ.get(WARM_ENV, "").strip() == "0":
        return None
    text = environ.get(PERSIST_ENV, "").strip()
    if not text:
        return DEFAULT_PERSIST
    if not text.isdigit() or int(text) == 0:
        return None
    return int(text)


def command_word(argv: list[str]) -> str | None:
    return next((word for word in argv if not word.startswith("-")), None)


def served_warm(argv: list[str]) -> bool:
    """Whether this command line is one a warm controller runs (see COMMANDS)."""
    word = command_word(argv)
    if word not in COMMANDS:
        return False
    options = argv[:argv.index("--")] if "--" in argv else argv
    return not (word == "logs" and any(o in _FOLLOW or (o.startswith("-") and not
                                                        o.startswith("--") and "f" in o[1:])
                                       for o in options))


def private_dir(template: str) -> str | None:
    """The directory, made if need be; None unless it is ours alone (0700, not a link)."""
    path = os.path.expanduser(template.format(uid=os.getuid()))
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return None
    if (info.st_mode & 0o170000) != 0o040000 or info.st_uid != os.getuid() \
            or info.st_mode & 0o077:
        return None
    return path


def place_for(environ) -> Place | None:
    """Where this process's warm controller would listen; None where there is none to be
    had: turned off, no unix sockets, no private directory with room for a socket's path."""
    if persist_seconds(environ) is None or not hasattr(_socket, "AF_UNIX") \
            or "_ARGCOMPLETE" in environ:
        return None
    key = start_up_key(environ)
    name = "%08x" % zlib.crc32(key.encode("utf-8", "surrogateescape"))
    for template in _DIRS:
        path = private_dir(template)
        if path and len(os.path.join(path, name + ".sock.12345678")) <= _MAX_SOCKET_PATH:
            return Place(key, os.path.join(path, name))
    return None


def encode_request(key: str, argv: list[str], cwd: str, environ: dict[str, str],
                   umask: int) -> bytes:
    body = marshal.dumps((PROTOCOL, key, argv, cwd, environ, umask))
    return len(body).to_bytes(4, "big") + body


def decode_request(body: bytes) -> tuple[str, list[str], str, dict[str, str], int] | None:
    """The request, or None for anything but this protocol's (never an exception: a
    client of another version must be told to run cold, not crash the server)."""
    try:
        protocol, key, argv, cwd, environ, umask = marshal.loads(body)
    except (EOFError, ValueError, TypeError):
        return None
    if protocol != PROTOCOL or not isinstance(argv, list) or not isinstance(environ, dict):
        return None
    return key, argv, cwd, environ, umask
