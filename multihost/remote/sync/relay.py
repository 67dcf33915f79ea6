"""Host-to-host relays: a receiver forwards the stream it reads to the next host, so big
files leave the controller (or the first host) once, whatever the number of hosts.

A relay is a chain: every host sends one copy on its own link, so each link runs at full
rate. Its hops are set up all at once, not one after the other: the controller starts a
node on every host of the chain over its own open connection, and each node listens on
a unix socket (its *rendezvous*, named by a token the controller made, in a private
directory) while it starts ``ssh NEXT`` running a join (``sync.join``,
rendezvous.py), which passes the next node its stdin, the pipe from that host's
sshd, over the socket: the node reads the stream straight from sshd, and the join
only waits for the node to say it has read it all. No byte is copied by a process in
between. Setting up a chain of any length costs about one handshake. Each node answers
the controller itself, over its own channel.

Nothing is lost: a next host that cannot be reached (its sshd down, no key, no node
there) is skipped, the chain goes on to the one after it, and the skipped host is
reported with its cause; the controller sends it its files itself. A node nobody
connected to gives up when the controller says the nodes before it are done (its stdin
ends). Every wait is bounded.
"""
import base64
import json
import os
import select
import shlex
import socket
import subprocess
import threading
import time

from .pipe import grow_pipe
from .rendezvous import DONE, READY, RelayError, receive_stdin, rendezvous_path
from .wire import StreamError

FLUSH_AT = 256 * 1024
DIRECT = 32 * 1024       # a piece this big is written to the next host as it is
HOP_READY = 40.0         # ssh's connect timeout (10 s) + JOIN_WAIT, with room to spare
UPSTREAM_WAIT = 900.0    # a node for its upstream, when the controller never says
# No byte from the upstream for this long: it is gone. A live upstream sends without
# pause (it forwards as it reads); one whose link was cut goes silent, and nothing else
# tells this host: its sshd keeps the session of a peer that vanished for hours. As
# long as the controller takes to call a host of a run lost, and a little more (the
# controller's request says how long: its MULTIHOST_LOST_AFTER, see waits.py), so the
# hosts behind a cut are fed from the controller in seconds, not minutes.
IDLE = 20.0
MAX_NOISE = 1 << 20      # what a host's shell may print before the join's answer


def any_login_shell(line):
    """``line`` (POSIX shell) as the next host's login shell passes it to `sh`, whichever
    that shell is (tcsh and fish read quotes their own way: base64 has nothing to read)."""
    encoded = base64.b64encode(line.encode("utf-8", "surrogateescape")).decode()
    return "exec sh -c 'eval \"$(echo %s | base64 -d)\"'" % encoded


class Rendezvous(object):
    """Where this node's upstream connects: its join connects to the socket and hands
    over its stdin. Several may connect
    (a host the chain went around may still have started its own hop here): the first
    that sends a byte is the upstream; one that ends without sending any is dropped. It
    listens until the node ends (``close``): a late hop connects and is dropped then,
    instead of waiting for a node that seems never to have started."""

    def __init__(self, token):
        self.path = rendezvous_path(token)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind(self.path)
            self.sock.listen(8)
        except OSError as exc:
            self.sock.close()
            raise RelayError("cannot listen on %s: %s" % (self.path, exc.strerror or exc))

    def close(self):
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def upstream(self, control, wait=UPSTREAM_WAIT, idle=IDLE):
        """The upstream's stream; ``control`` (the controller's stdin) ending means no
        upstream will come. Raises RelayError when none came."""
        conns = []    # connected, their stdin not handed over yet
        handed = {}   # a handed-over stdin: its fd -> the join's connection
        deadline = time.monotonic() + wait
        closing = False
        try:
            while True:
                left = 0 if closing else deadline - time.monotonic()
                if left < 0:
                    raise RelayError("no upstream host connected within %d s" % wait)
                watch = [self.sock] + conns + list(handed) + (
                    [] if closing else [control])
                ready = select.select(watch, [], [], left)[0]
                for fd in [f for f in handed if f in ready]:
                    conn = handed.pop(fd)
                    first = _first_byte(fd)
                    if first:
                        return _PipeStream(fd, conn, first, idle)
                    os.close(fd)  # ended without a byte: a hop the chain went around
                    conn.close()
                for conn in [c for c in conns if c in ready]:
                    conns.remove(conn)
                    fd = receive_stdin(conn)
                    if fd is None:
                        conn.close()
                    else:
                        handed[fd] = conn
                if self.sock in ready:
                    conns.append(self.sock.accept()[0])
                    continue  # look at what it hands over before anything else
                if closing and not ready:
                    raise RelayError("no upstream: the relay went around this host")
                if control in ready and not os.read(control.fileno(), 65536):
                    closing = True
        finally:
            for conn in conns:
                conn.close()
            for fd, conn in handed.items():
                os.close(fd)
                conn.close()


def _first_byte(fd):
    try:
        return os.read(fd, 1)
    except OSError:
        return b""


class _PipeStream(object):
    """The upstream's stream, read straight from the pipe its join handed over: a silent
    or broken upstream is a StreamError (this node's failure), never a hang or a
    traceback. Before it waits for more, what the node gathered for the next host is
    passed on (``before_wait``): a chain of 64 hops must not hold back 256 KB at each,
    on a slow link that is seconds before the last host gets a byte."""

    def __init__(self, fd, conn, first=b"", idle=IDLE):
        self.fd = fd
        self.idle = idle
        self.conn = conn
        self.first = first
        self.before_wait = None

    def read(self, count):
        if self.first:
            data, self.first = self.first[:count], self.first[count:]
            return data
        if not select.select([self.fd], [], [], 0)[0]:
            if self.before_wait is not None:
                self.before_wait()
            if not select.select([self.fd], [], [], self.idle)[0]:
                raise StreamError("the upstream host sent nothing for %d s" % self.idle)
        try:
            return os.read(self.fd, count)
        except OSError as exc:
            raise StreamError("the upstream host broke off (%s)" % (exc.strerror or exc))

    def done(self):
        """The whole stream is read: the join may end (and its sshd with it)."""
        try:
            self.conn.sendall(DONE)
        except OSError:
            pass

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.conn.close()


class Downstream(object):
    """``ssh NEXT sync.join`` fed with every byte this node reads. The first of ``hops``
    that answers is the next node; those before it are skipped, each with its cause."""

    def __init__(self, hops, token):
        self.skipped = {}
        self.hop = None
        self.proc = None
        self.failure = None
        self.pending = bytearray()
        self.stderr = b""
        for hop in hops:
            cause = self._start(hop, token)
            if cause is None:
                self.hop = hop
                break
            self.skipped[str(hop["rank"])] = cause

    def _start(self, hop, token):
        name = hop.get("name", str(hop["rank"]))
        argv = list(hop["ssh"]) + [any_login_shell(
            hop["line"] + " " + shlex.quote(json.dumps({"token": token})))]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            return "cannot start ssh to %s: %s" % (name, exc.strerror)
        errors = []
        reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()))
        reader.daemon = True
        reader.start()
        seen = _wait_ready(proc.stdout, HOP_READY)
        if seen is True:
            self.proc, self._errors, self._reader = proc, errors, reader
            grow_pipe(proc.stdin)  # we write a whole chunk and go on with our own
            return None
        proc.kill()  # ours: never left behind
        code = proc.wait()
        reader.join(5)
        last = _last_line(b"".join(errors))
        answer = _last_json(seen or b"")
        if isinstance(answer, dict) and answer.get("error"):
            return "%s: %s" % (name, answer["error"])
        if code == 97:
            return "the multihost helper is not installed on %s" % name
        if code == 255:
            return "host-to-host ssh to %s failed: %s" % (name, last or "exit 255")
        if code == -9:
            return "host-to-host ssh to %s: no answer within %d s" % (name, HOP_READY)
        return "relay to %s ended with exit %s%s" % (name, code, (": " + last) if last else "")

    def feed(self, data):
        """Forward bytes; small pieces (record headers, small files) are gathered into
        large writes, so the next host sees a few big ssh packets, not many tiny ones.
        A piece as big as an ssh packet goes as it is: gathering it would only copy it
        twice more."""
        if self.proc is None or self.failure is not None:
            return
        if len(data) >= DIRECT:
            self.flush()
            self._write(data)
            return
        self.pending += data
        if len(self.pending) >= FLUSH_AT:
            self.flush()

    def flush(self):
        if self.pending and self.failure is None:
            self._write(bytes(self.pending))
        self.pending = bytearray()

    def _write(self, data):
        try:
            self.proc.stdin.write(data)
        except (OSError, ValueError):
            self.failure = "the relay to %s broke off" % self.hop.get("name")

    def end_input(self):
        """Everything is sent: let the next node finish while we finish our own writes."""
        if self.proc is not None and not self.proc.stdin.closed:
            self.flush()
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def finish(self):
        """{rank: {"error": ...}} for the hosts this node could not pass the stream to."""
        nodes = dict((rank, {"error": cause, "relay": True}) for rank, cause in self.skipped.items())
        if self.proc is None:
            return nodes
        self.end_input()
        out = self.proc.stdout.read()
        code = self.proc.wait()
        self._reader.join(5)
        answer = _last_json(out)
        if code != 0 or not (isinstance(answer, dict) and answer.get("ok")):
            name = self.hop.get("name")
            if isinstance(answer, dict) and answer.get("error"):
                cause = "%s: %s" % (name, answer["error"])
            else:
                last = _last_line(b"".join(self._errors))
                cause = (self.failure or "the relay to %s broke off" % name) + (
                    ": " + last if last else " (exit %s)" % code)
            nodes[str(self.hop["rank"])] = {"error": cause, "relay": True}
        return nodes


def _wait_ready(stdout, wait):
    """True once the join says it is connected; else what it printed (its error)."""
    deadline = time.monotonic() + wait
    seen = b""
    fd = stdout.fileno()
    while len(seen) < MAX_NOISE:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return seen
        data = os.read(fd, 65536)
        if not data:
            return seen
        seen += data
        if b"\n" + READY + b"\n" in seen:
            return True
    return seen


def _last_line(data):
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""


def _last_json(out):
    for line in reversed(out.decode("utf-8", "replace").strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


class Node(object):
    """This host's place in a chain (``request["relay"]``): the head reads the
    controller's stream from stdin; any other node listens for its upstream."""

    def __init__(self, spec):
        token = spec.get("token")
        self.upstream = None
        self.rendezvous = Rendezvous(token) if spec.get("listen") else None
        try:
            self.idle = float(spec.get("idle") or IDLE)
            self.downstream = Downstream(spec.get("next") or [], token)
        except (KeyError, TypeError, AttributeError, ValueError):
            self.close()
            raise RelayError("bad relay request: run the sync again")

    def stream(self, stdin):
        if self.rendezvous is None:
            return stdin
        try:
            self.upstream = self.rendezvous.upstream(stdin, idle=self.idle)
        except RelayError:
            self.downstream.end_input()  # the next node drops a hop that sent nothing
            self.downstream.finish()
            self.close()
            raise
        self.upstream.before_wait = self.downstream.flush
        return self.upstream

    def close(self):
        """The socket file removed: nothing of this node is left on the host."""
        if self.rendezvous is not None:
            self.rendezvous.close()
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None


