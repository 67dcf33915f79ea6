"""The process half of the preflight, run on a host: which TCP ports are taken and by
whom (/proc/net/tcp, /proc/*/fd), and which of this user's processes an earlier
multihost run left behind (MULTIHOST_RUN_ID in /proc/*/environ, live records under
~/.multihost/runs).
Stdlib only, Python 3.6+; nothing here is ever killed, only reported.
"""
import errno
import json
import os
import socket

from . import run_files

TCP_LISTEN = "0A"
TCP_TIME_WAIT = "06"
# node.json states of a run that has not ended (see docs/design.md, "State on a host").
LIVE_STATES = ("prepared", "pending", "syncing", "launching", "running")


# -- ports ----------------------------------------------------------------------------
def parse_proc_net_tcp(text):
    """/proc/net/tcp or tcp6 into [(local_port, state, inode)]."""
    entries = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1]:
            continue
        port = int(fields[1].rsplit(":", 1)[1], 16)
        entries.append((port, fields[3], int(fields[9])))
    return entries


def tcp_sockets():
    entries = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                entries.extend(parse_proc_net_tcp(f.read()))
        except OSError:
            pass
    return entries


def _bind_free(port):
    """Could a listener bind this port the way torch's TCPStore does (SO_REUSEADDR, all
    addresses)? A dual-stack [::] bind collides with any IPv4 or IPv6 holder; a host
    without IPv6 gets the IPv4 test."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((address, port))
            return True
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            # IPv6 switched off (EADDRNOTAVAIL and friends): the IPv4 test decides.
        finally:
            sock.close()
    return True


def socket_owners(inodes):
    """{inode: {"pid", "command"}} by reading /proc/*/fd; other users' are not readable."""
    wanted = dict(("socket:[%d]" % i, i) for i in inodes)
    owners = {}
    if not wanted:
        return owners
    for pid in _pids():
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir + "/" + fd)
            except OSError:
                continue
            if target in wanted and wanted[target] not in owners:
                owners[wanted[target]] = {"pid": pid, "command": _command(pid)}
        if len(owners) == len(wanted):
            break
    return owners


def ports_facts(request):
    """Which of the wanted ports a listener could not bind, and who holds them; with a
    scan range (--start-port auto), every port listened on in it. The bind test answers
    the common case; /proc is read (a walk of every socket) only to name an owner."""
    wanted = set(request.get("ports") or []) - set(request.get("own_ports") or [])
    scan = request.get("scan")
    taken = [port for port in sorted(wanted) if not _bind_free(port)]
    entries = []
    if taken or scan:
        own = set(request.get("own_inodes") or [])
        entries = [e for e in tcp_sockets() if e[2] not in own]
    busy = {}
    for port in taken:
        held = [i for p, s, i in entries if p == port and s == TCP_LISTEN] or \
               [i for p, s, i in entries if p == port and s != TCP_TIME_WAIT]
        busy[port] = held[0] if held else 0
    owners = socket_owners([i for i in busy.values() if i])
    facts = {"busy": [dict({"port": p}, **owners.get(i, {})) for p, i in sorted(busy.items())]}
    if scan:
        low, high = scan
        facts["listening"] = sorted(set(p for p, s, _ in entries if s == TCP_LISTEN and low <= p <= high))
    facts["ephemeral"] = _read_ints("/proc/sys/net/ipv4/ip_local_port_range")
    return facts


# -- processes ------------------------------------------------------------------------
def _pids():
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _command(pid, limit=120):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            text = f.read(4096).replace(b"\0", b" ").decode("utf-8", "replace").strip()
        if text:
            return text[:limit]
        with open("/proc/%d/comm" % pid) as f:
            return "[%s]" % f.read().strip()
    except OSError:
        return "?"


def leftover_facts(request):
    """This user's processes of earlier multihost runs: they carry MULTIHOST_RUN_ID in
    their environment; and runs whose node.json says they still run with a live pid.
    Other users' processes are none of this run's business: never reported."""
    runs = {}
    for run_id, pids in sorted(run_files.own_marked_processes(run_files.ancestors()).items()):
        runs[run_id] = {"run_id": run_id, "pids": sorted(pids), "command": _command(min(pids))}
    base = os.path.join(run_files.root_dir(), "runs")
    try:
        names = sorted(os.listdir(base))[-50:]
    except OSError:
        names = []
    for name in names:
        try:
            with open(os.path.join(base, name, "node.json")) as f:
                node = json.load(f)
            supervisor = node.get("supervisor") or {}
            pid = int(supervisor.get("pid") or node.get("pid") or 0)
            ticks = supervisor.get("ticks") if supervisor.get("pid") else None
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        if node.get("state") in LIVE_STATES and pid > 1 and run_files.is_alive(pid, ticks):
            run = runs.setdefault(name, {"run_id": name, "pids": [], "command": _command(pid)})
            if pid not in run["pids"]:
                run["pids"].append(pid)  # the supervisor, which the job's env may not name
            run["pgid"] = node.get("pgid")
    return sorted(runs.values(), key=lambda r: r["run_id"])


def _read_ints(path):
    try:
        with open(path) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return None
