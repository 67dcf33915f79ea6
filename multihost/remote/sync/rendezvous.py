"""A relay node's rendezvous, as Python's join on its host sees it (``sync.join``).

A hop of the chain runs this join on the next host. It connects to the node the
controller started on its host (a unix socket named by the sync's token, in the user's
own 0700 directory) and hands it its standard input, the pipe from sshd, as a file
descriptor (SCM_RIGHTS). The node reads the stream from that pipe itself; the join
copies nothing, and waits only for the node's word that it read the whole stream, since
its own end would end the ssh session that carries it.

Kept apart from relay.py (the node) so that a join, one per host of a chain, starts
with no more than it needs. Stdlib only, Python 3.6+.
"""
import errno
import json
import os
import socket
import stat
import struct
import sys
import time

from ..machine import host_dir
from .pipe import grow_pipe

CACHE_ROOT = os.path.join("~", ".cache", "multihost")
JOIN_WAIT = 20.0         # sync.join: for the node to appear on its host
READY = b'{"ready":true}'
HANDOFF = b"F"           # a join's one byte on the rendezvous, with its stdin attached
DONE = b"D"              # the node's answer to its join: it read the whole stream
_FD = struct.Struct("i")
_HEX = frozenset("0123456789abcdef")


class RelayError(Exception):
    pass


def rendezvous_path(token):
    """The socket of the node with this token, in the user's own 0700 directory."""
    if not isinstance(token, str) or not 16 <= len(token) <= 64 or not _HEX.issuperset(token):
        raise RelayError("bad relay token")
    return os.path.join(relay_dir(), token + ".sock")


def relay_dir():
    """The user's own 0700 directory of relay rendezvous, made if missing."""
    directory = os.path.join(host_dir(CACHE_ROOT), "relay")
    try:
        os.makedirs(directory, 0o700, exist_ok=True)
        st = os.lstat(directory)
    except OSError as exc:
        raise RelayError("cannot make %s: %s" % (directory, exc.strerror))
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RelayError("%s is not a private directory of this user" % directory)
    return directory


def hand_over(sock, fd):
    """Pass ``fd`` (a join's stdin) to the node at the other end of ``sock``."""
    sock.sendmsg([HANDOFF], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _FD.pack(fd))])


def receive_stdin(conn):
    """The fd a join handed over on ``conn``, or None (it sent something else, or went
    away). Any other fd that came with it is closed."""
    try:
        data, ancillary, _, _ = conn.recvmsg(1, socket.CMSG_SPACE(_FD.size * 4))
    except OSError:
        return None
    fds = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % _FD.size
            fds += [_FD.unpack_from(payload, at)[0] for at in range(0, usable, _FD.size)]
    if data == HANDOFF and len(fds) == 1:
        return fds[0]
    for fd in fds:
        os.close(fd)
    return None


def join(request):
    """sync.join: connect to this host's node of the chain and hand it this process's
    stdin, the stream from the host before; then wait until the node has read it all
    (this process's end ends the ssh session that carries the stream)."""
    try:
        path = rendezvous_path(request.get("token"))
    except RelayError as exc:
        return _answer(False, str(exc))
    deadline = time.monotonic() + JOIN_WAIT
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            break
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                return _answer(False, "cannot reach the relay node: %s" % exc.strerror)
            if time.monotonic() > deadline:
                return _answer(False, "no relay node started here within %d s" % JOIN_WAIT)
            time.sleep(0.05)
    grow_pipe(sys.stdin)  # sshd keeps writing while the node writes a chunk to disk
    try:
        hand_over(sock, 0)
        _write_line(READY)
        said = sock.recv(1)
    except OSError as exc:
        said = b""
        cause = exc.strerror or str(exc)
    else:
        cause = "it ended before the stream did"
    finally:
        sock.close()
    if said != DONE:
        return _answer(False, "the relay node here went away (%s)" % cause)
    return _answer(True, None)


def _write_line(data):
    sys.stdout.buffer.write(data + b"\n")
    sys.stdout.buffer.flush()


def _answer(ok, error):
    payload = {"ok": True, "result": None} if ok else {
        "ok": False, "error": error, "fix": "the controller sends this host its files itself"}
    _write_line(json.dumps(payload, separators=(",", ":")).encode())
    return 0 if ok else 1

