"""Echo many addresses at once, as the preflight measures reachability and latency: our
own ICMP socket (an unprivileged ping socket, else a raw one as root), else the ``ping``
command, else a plain "may not send ICMP" that callers must report.

Apart from net.py (interfaces, TCP probes, the rendezvous test) because this is
one mechanism with its own wire format and retry rule, used alike on a host and on the
controller. Stdlib only, Python 3.6 (it is shipped with the helper). Every wait is
bounded: a silent peer costs its timeout, never a hang.
"""
import os
import re
import select
import socket
import struct
import time

ECHO_REQUEST = {socket.AF_INET: 8, socket.AF_INET6: 128}
ECHO_REPLY = {socket.AF_INET: 0, socket.AF_INET6: 129}
PROTO = {socket.AF_INET: socket.IPPROTO_ICMP, socket.AF_INET6: socket.IPPROTO_ICMPV6}
_PING_TIME = re.compile(r"time[=<]([0-9.]+) ?ms")


def family_of(address):
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def _icmp_socket(family):
    """An ICMP socket: unprivileged "ping socket" first, raw (root) second; None if neither."""
    for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):
        try:
            return socket.socket(family, kind, PROTO[family]), kind
        except OSError:
            continue
    return None, None


def _echo(family, kind, ident, seq):
    header = struct.pack("!BBHHH", ECHO_REQUEST[family], 0, 0, ident, seq)
    payload = b"multihost-check!"
    if family == socket.AF_INET:  # the kernel fills in ICMPv6 checksums itself
        header = struct.pack("!BBHHH", 8, 0, _checksum(header + payload), ident, seq)
    return header + payload


def _icmp_ping(family, addresses, timeout, tries):
    """{address: rtt_ms | None}, or None when this host does not let us send ICMP."""
    sock, kind = _icmp_socket(family)
    if sock is None:
        return None
    ident = (os.getpid() ^ int(time.time() * 1000)) & 0xFFFF or 1
    results = dict((a, None) for a in addresses)
    sent = {}  # seq -> (address, send time)
    deadline = time.monotonic() + timeout
    interval = timeout / max(1, tries)
    try:
        sock.setblocking(False)
        for attempt in range(tries):
            for index, address in enumerate(addresses):
                if results[address] is None:
                    seq = (index * tries + attempt) & 0xFFFF
                    sent[seq] = (address, time.monotonic())
                    try:
                        sock.sendto(_echo(family, kind, ident, seq), (address, 0))
                    except OSError:
                        pass  # no route: stays None, and the next try may find one
            round_end = min(deadline, time.monotonic() + interval)
            while any(v is None for v in results.values()):
                wait = round_end - time.monotonic()
                if wait <= 0 or not select.select([sock], [], [], wait)[0]:
                    break
                try:
                    data, source = sock.recvfrom(2048)
                except OSError:
                    continue
                if family == socket.AF_INET and kind == socket.SOCK_RAW:
                    data = data[(data[0] & 0x0F) * 4:]  # raw IPv4 sockets see the IP header
                if len(data) < 8:
                    continue
                kind_byte, _, _, rid, seq = struct.unpack("!BBHHH", data[:8])
                if kind_byte != ECHO_REPLY[family] or seq not in sent:
                    continue
                if kind == socket.SOCK_RAW and rid != ident:
                    continue  # someone else's ping; ping sockets only ever see their own
                address, when = sent[seq]
                if results.get(address) is None:
                    results[address] = (time.monotonic() - when) * 1000.0
            if time.monotonic() >= deadline or all(v is not None for v in results.values()):
                break
    finally:
        sock.close()
    return results


def _binary_ping(addresses, timeout):
    """The `ping` command (setuid or with CAP_NET_RAW) for hosts without ICMP sockets."""
    import subprocess
    wait = max(1, int(round(timeout)))
    procs = {}
    for address in addresses:
        try:
            procs[address] = subprocess.Popen(
                ["ping", "-n", "-c", "1", "-W", str(wait), address], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        except OSError:
            return None  # no ping command at all
    results = {}
    denied = 0
    for address, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=wait + 2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out, err = b"", b""
        match = _PING_TIME.search(out.decode("utf-8", "replace"))
        results[address] = float(match.group(1)) if match else None
        if b"not permitted" in err or b"Operation not permitted" in out:
            denied += 1
    if denied and denied == len(addresses):
        return None
    return results


# A first echo to a peer waits for its link address: the kernel asks (ARP/ND) again every
# second, three times, before giving up. On a busy network with many hosts resolving at
# once the first answer may be lost, so a silent peer gets a second round that covers the
# kernel's remaining asks before it counts as unreachable.
PING_RETRY = 2.0


def ping_many(addresses, timeout=1.0, tries=3, retry=PING_RETRY):
    """Echo every address at once: ({address: rtt_ms | None}, method).

    Addresses still silent after ``timeout`` are echoed again for ``retry`` seconds.
    method is "icmp" (our own socket), "ping" (the ping command) or None when this
    host may not send ICMP at all; then every value is None and callers must say so.
    """
    addresses = list(dict.fromkeys(addresses))
    results = {}
    method = "icmp"
    for family in (socket.AF_INET, socket.AF_INET6):
        group = [a for a in addresses if family_of(a) == family]
        if not group:
            continue
        found, method_here = _ping_family(family, group, timeout, tries)
        silent = [a for a in group if found.get(a) is None]
        if silent and method_here and retry > 0:
            again, _ = _ping_family(family, silent, retry, tries)
            found.update((a, rtt) for a, rtt in again.items() if rtt is not None)
        if method_here != "icmp":
            method = method_here
        results.update(found)
    return results, method


def _ping_family(family, group, timeout, tries):
    found = _icmp_ping(family, group, timeout, tries)
    if found is not None:
        return found, "icmp"
    found = _binary_ping(group, timeout)
    if found is not None:
        return found, "ping"
    return dict((a, None) for a in group), None
