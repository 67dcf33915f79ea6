"""The network half of the preflight, run on a host (and, being stdlib only, also on the
controller for its own reachability probe): a timed TCP handshake, the interface that
holds an address, and the rendezvous test (a temporary listener on the first host, a
connection from every other host). ICMP echo to many addresses at once is ping.py.

Everything here is bounded by a timeout: a check must never hang on a dead peer.
"""
import errno
import os
import socket
import struct
import threading
import time

from .ping import family_of

def tcp_probe(address, port, timeout):
    """Time a TCP handshake: {"ms": float} or {"error": "refused"|"timeout"|...}."""
    started = time.monotonic()
    try:
        sock = socket.create_connection((address, port), timeout)
    except OSError as exc:
        return {"error": error_kind(exc), "text": str(exc.strerror or exc)}
    sock.close()
    return {"ms": (time.monotonic() - started) * 1000.0}


def error_kind(exc):
    if isinstance(exc, socket.timeout):
        return "timeout"
    code = getattr(exc, "errno", None)
    if code == errno.ECONNREFUSED:
        return "refused"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return "unreachable"
    if isinstance(exc, socket.gaierror):
        return "name"
    return "error"


# -- interfaces -----------------------------------------------------------------------
def parse_ip_addr(text):
    """`ip -o addr show` into {interface: [addresses]} (secondaries and IPv6 included)."""
    interfaces = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("inet", "inet6"):
            continue
        name = fields[1].split("@", 1)[0]
        interfaces.setdefault(name, []).append(fields[3].split("/", 1)[0])
    return interfaces


def parse_proc_net_route(text):
    """/proc/net/route into [(interface, network, mask, via_gateway)], addresses as the
    kernel writes them (little-endian ints, compared as such)."""
    routes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8:
            try:
                routes.append((fields[0], int(fields[1], 16), int(fields[7], 16),
                               bool(int(fields[3], 16) & 0x2)))
            except ValueError:
                continue
    return routes


def iface_by_route(address, routes):
    """The interface whose directly connected network holds an IPv4 address: the one
    that carries traffic from that address."""
    value = struct.unpack("<I", socket.inet_aton(address))[0]
    best = None
    for name, network, mask, via_gateway in routes:
        if not via_gateway and value & mask == network:
            if best is None or bin(mask).count("1") > best[0]:
                best = (bin(mask).count("1"), name)
    return best[1] if best else None


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def iface_of_address(address):
    """The interface that holds a local address, from /proc (no process started);
    `ip -o addr` when /proc does not tell (a /32 address, say)."""
    if ":" in address:
        packed = socket.inet_pton(socket.AF_INET6, address.split("%")[0])
        for line in _read("/proc/net/if_inet6").splitlines():
            fields = line.split()
            if len(fields) == 6 and bytes.fromhex(fields[0]) == packed:
                return fields[5]
    else:
        name = iface_by_route(address, parse_proc_net_route(_read("/proc/net/route")))
        if name:
            return name
    return interface_of(address, ip_addr_table())


def ip_addr_table():
    import subprocess
    try:
        done = subprocess.run(["ip", "-o", "addr", "show"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=5)
        if done.returncode == 0:
            return parse_ip_addr(done.stdout.decode("utf-8", "replace"))
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {}


def interface_names():
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return sorted(name for _, name in socket.if_nameindex())


def is_local_address(address):
    """Does this host hold the address? Only then can a socket be bound to it."""
    try:
        probe = socket.socket(family_of(address), socket.SOCK_DGRAM)
    except OSError:
        return False
    try:
        probe.bind((address, 0))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def route_source(address):
    """The local address the kernel would use to reach ``address`` (a UDP connect sends
    nothing); None when there is no route."""
    try:
        family = family_of(address)
        probe = socket.socket(family, socket.SOCK_DGRAM)
        try:
            probe.connect((address, 9))
            return probe.getsockname()[0]
        finally:
            probe.close()
    except OSError:
        return None


def interface_of(address, table):
    for name, addresses in table.items():
        if address in addresses:
            return name
    return None


# -- the rendezvous test --------------------------------------------------------------
class Listener(object):
    """A temporary TCP listener on the master port: sends a token to whoever connects and
    reads back the connecting host's rank, so a foreign process on the port can not pass
    for ours."""

    def __init__(self, port, token, family=socket.AF_INET):
        self.port = port
        self.token = token.encode()
        self.accepted = []  # [{"rank", "from"}]
        self.error = None
        self.inode = None
        self._stop = threading.Event()
        self._sock = None
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            # As torch's TCPStore does: a port only in TIME_WAIT counts as free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
            sock.listen(256)
            sock.settimeout(0.2)
            self._sock = sock
            self.inode = os.fstat(sock.fileno()).st_ino
        except OSError as exc:
            self.error = os.strerror(exc.errno) if exc.errno else str(exc)
            return
        self._thread = threading.Thread(target=self._serve)
        self._thread.daemon = True
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            worker = threading.Thread(target=self._greet, args=(conn, peer[0]))
            worker.daemon = True
            worker.start()

    def _greet(self, conn, peer):
        try:
            conn.settimeout(3)
            conn.sendall(self.token + b"\n")
            rank = conn.makefile("rb").readline(32).strip()
            self.accepted.append({"rank": int(rank) if rank.isdigit() else None, "from": peer})
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def close(self):
        self._stop.set()
        if self._sock is not None:
            try:  # wakes the accepting thread at once (Linux), instead of its next timeout
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        return {"listening": self.error is None, "error": self.error, "port": self.port,
                "accepted": list(self.accepted)}


RETRIED = ("refused", "unreachable", "timeout")


def connect_master(address, port, token, rank, timeout=3.0):
    """Connect to the first host's listener as torchrun's workers would: a refused
    connection is retried until ``timeout`` (the listener may come up a moment later)."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        started = time.monotonic()
        try:
            # No single try may eat the whole window: a SYN lost to a slow first
            # resolution must leave time for another.
            sock = socket.create_connection((address, port), max(0.05, min(remaining, timeout / 2)))
        except OSError as exc:
            failure = {"ok": False, "error": error_kind(exc), "text": str(exc.strerror or exc)}
            # Refused: the listener is not up yet. Unreachable or timed out: the first
            # resolution of the master's link address may have been lost on a busy
            # network (see net_ping.PING_RETRY). Both are worth another try within the window.
            if failure["error"] not in RETRIED or deadline - time.monotonic() < 0.05:
                return failure
            time.sleep(0.05 if failure["error"] == "refused" else 0.2)
            continue
        ms = (time.monotonic() - started) * 1000.0
        try:
            # Our listener greets at once; a foreign server may say nothing at all.
            sock.settimeout(max(0.2, min(1.5, deadline - time.monotonic())))
            line = sock.makefile("rb").readline(64).strip()
            if line != token.encode():
                return {"ok": False, "error": "foreign", "ms": ms,
                        "text": "another program answers on this port"}
            sock.sendall(("%d\n" % rank).encode())
            return {"ok": True, "ms": ms, "source": sock.getsockname()[0]}
        except OSError as exc:
            return {"ok": False, "error": "foreign", "ms": ms,
                    "text": "connected, but no greeting (%s)" % (exc.strerror or exc)}
        finally:
            sock.close()
