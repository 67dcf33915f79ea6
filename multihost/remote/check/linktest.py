"""Host-to-host throughput, run on every host at once (``linktest.run``).

Each host gets its own column of a round-robin schedule: in round r it meets one peer
(or sits out). Within a round the lower rank sends for ``seconds`` first, then the
higher rank sends back; a host does its rounds in order, so its NIC never carries two
tests at once, and no clock is shared: a sender connects to its peer's listener and
waits for a go byte, which the peer gives only when that test is its current step.
The receiver measures (bytes from its first byte to the sender's close) and tells the
sender, so both ends report the same figure.

Every wait is bounded: a silent peer costs its pair at most ``window`` seconds, and the
whole call ends by its budget. Nothing is left behind: the listener and every
connection close with the call.
"""
import json
import os
import socket
import threading
import time

from .net import interface_of, ip_addr_table, route_source
from ..proto import OpError, op

CHUNK = 256 * 1024
HEADER_LIMIT = 512


def _read_line(conn, limit=HEADER_LIMIT):
    data = b""
    while not data.endswith(b"\n"):
        piece = conn.recv(1)
        if not piece or len(data) >= limit:
            raise OSError("the peer closed the connection")
        data += piece
    return json.loads(data.decode("utf-8"))


class Inbox(object):
    """The listener: connections from peers, kept by (peer rank, round, direction) until
    this host's schedule reaches them."""

    def __init__(self, port, token):
        self.token = token
        self.waiting = {}
        self.cond = threading.Condition()
        self.closed = False
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("", port))
        except OSError as exc:
            self.sock.close()
            raise OpError("can not listen on port %d for the link test: %s" % (port, exc),
                          "free the port, or give another --start-port")
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        thread = threading.Thread(target=self._accept)
        thread.daemon = True
        thread.start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                conn.settimeout(2.0)
                hello = _read_line(conn)
                if hello.get("token") != self.token:
                    raise OSError("not ours")
                key = (int(hello["from"]), int(hello["round"]), int(hello["step"]))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                conn.close()
                continue
            with self.cond:
                self.waiting[key] = conn
                self.cond.notify_all()

    def take(self, key, deadline):
        with self.cond:
            while key not in self.waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            return self.waiting.pop(key)

    def close(self):
        self.closed = True
        self.sock.close()
        with self.cond:
            for conn in self.waiting.values():
                conn.close()
            self.waiting.clear()


def receive(inbox, key, deadline):
    """Give the waiting sender its go, count what arrives until it closes."""
    conn = inbox.take(key, deadline)
    if conn is None:
        return {"error": "the peer never connected"}
    try:
        conn.settimeout(max(0.5, deadline - time.monotonic()))
        conn.sendall(b"g")
        total, first, last = 0, None, None
        buf = bytearray(CHUNK)
        while True:
            n = conn.recv_into(buf)
            if not n:
                break
            last = time.monotonic()
            if first is None:
                first = last
            total += n
        seconds = (last - first) if first is not None else 0.0
        result = {"bytes": total, "seconds": round(seconds, 6)}
        conn.sendall((json.dumps(result) + "\n").encode())
        return result
    except (OSError, socket.timeout) as exc:
        return {"error": "receiving: %s" % exc}
    finally:
        conn.close()


def send(address, port, hello, seconds, deadline):
    """Connect (retrying while the peer finishes its previous round), wait for the go,
    send for ``seconds``, then read back what the peer counted."""
    conn = None
    while conn is None:
        try:
            conn = socket.create_connection((address, port), timeout=1.0)
        except OSError as exc:
            if time.monotonic() + 0.1 >= deadline:
                return {"error": "can not connect to %s:%d: %s" % (address, port, exc)}
            time.sleep(0.1)
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(max(0.5, deadline - time.monotonic()))
        conn.sendall((json.dumps(hello) + "\n").encode())
        if conn.recv(1) != b"g":
            return {"error": "the peer did not start the test"}
        payload = b"\0" * CHUNK
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        result = _read_line(conn)
        return {"bytes": int(result["bytes"]), "seconds": float(result["seconds"])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return {"error": "sending: %s" % exc}
    finally:
        conn.close()


def _speed(iface):
    """The link speed the kernel reports, in Mbit/s (None: unknown, as for most
    virtual devices that say -1)."""
    try:
        with open("/sys/class/net/%s/speed" % iface) as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return value if value > 0 else None


@op("linktest.run")
def run(request):
    rank = int(request["rank"])
    addresses = request["addresses"]
    port = int(request["port"])
    seconds = float(request["seconds"])
    window = float(request.get("window", 10.0))
    schedule = request["schedule"]
    end_by = time.monotonic() + float(request["budget"])
    inbox = Inbox(port, request["token"])
    table = ip_addr_table()
    results = []
    try:
        for round_no, peer in enumerate(schedule):
            if peer is None:
                continue
            peer = int(peer)
            source = route_source(addresses[peer])
            entry = {"peer": peer, "iface": interface_of(source, table) if source else None}
            steps = ("sent", "received") if rank < peer else ("received", "sent")
            for step, role in enumerate(steps):
                deadline = min(end_by, time.monotonic() + window + seconds)
                if time.monotonic() >= end_by:
                    entry[role] = {"error": "out of time"}
                elif role == "sent":
                    hello = {"token": request["token"], "from": rank, "round": round_no,
                             "step": step}
                    entry[role] = send(addresses[peer], port, hello, seconds, deadline)
                else:
                    entry[role] = receive(inbox, (peer, round_no, step), deadline)
            results.append(entry)
    finally:
        inbox.close()
    ifaces = sorted(set(e["iface"] for e in results if e.get("iface")))
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"pairs": results, "load": load, "cpus": os.cpu_count(),
            "speeds": dict((name, _speed(name)) for name in ifaces)}
