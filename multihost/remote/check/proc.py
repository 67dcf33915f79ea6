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

from ..run import files as run_files
from ..run import processes as run_processes

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
    marked = run_processes.own_marked_processes(run_processes.ancestors())
    for run_id, pids in sorted(marked.items()):
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
        if node.get("state") in LIVE_STATES and pid > 1 and run_processes.is_alive(pid, ticks):
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


# -- who else is here: the host registry and trainings multihost did not start -------------
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch",
             "paddle.distributed.launch", "fleetrun", "deepspeed")
APPS = ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader,nounits"]


def holds_facts(request):
    """Every entry of the host registry (remote/registry/holds.py) and who asks."""
    from ..registry import holds
    entries, trouble = holds.scan()
    return {"me": holds.me(), "entries": entries, "trouble": trouble}


def _owner(pid):
    import pwd
    try:
        uid = os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None, None
    try:
        return uid, pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, str(uid)


def _launcher(pid):
    """The launcher a process runs, by its argv (python -m X, or X's own script)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read(4096).decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    for word in argv[:4]:
        base = os.path.basename(word)
        if base in LAUNCHERS or word in LAUNCHERS:
            return base
    return None


def _gpu_apps():
    import subprocess
    try:
        out = subprocess.run(APPS, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=5, universal_newlines=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    apps = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            apps.setdefault(int(parts[0]), []).append(parts[1])
    return apps


def foreign_facts(request):
    """Trainings multihost did not start: launcher processes (torchrun, paddle's launch)
    and GPU holders that descend from no live run of the registry nor one of this user's
    multihost runs. Each with its user, pid, command, the pids below it, its GPUs."""
    from ..registry import holds
    pids = _pids()
    parent = {}
    for pid in pids:
        stat = run_processes._stat(pid)
        if stat:
            parent[pid] = stat[1]
    roots = set(e["pid"] for e in holds.read_all() if e["kind"] == "run" and e["live"] and e["pid"])
    marked = set()
    for found in run_processes.own_marked_processes(run_processes.ancestors()).values():
        marked.update(found)
    # Not this probe's ancestors: sshd's daemon is every session's ancestor.
    me = os.getpid()

    def managed(pid):
        if pid == me:
            return True
        seen = 0
        while pid > 1 and seen < 64:
            if pid in roots or pid in marked:
                return True
            pid, seen = parent.get(pid, 0), seen + 1
        return False

    def top(pid):
        """The launcher above a process, else the process itself."""
        best, cur, seen = pid, pid, 0
        while cur > 1 and seen < 64:
            if _launcher(cur):
                best = cur
            cur, seen = parent.get(cur, 0), seen + 1
        return best

    found = {}
    for pid in pids:
        if _launcher(pid) and not managed(pid):
            found.setdefault(top(pid), set())
    apps = _gpu_apps() if _on_path("nvidia-smi") else {}
    for pid, uuids in apps.items():
        if not managed(pid):
            found.setdefault(top(pid), set()).update(uuids)
    below = {}
    for pid in pids:
        cur, seen = parent.get(pid, 0), 0
        while cur > 1 and seen < 64:
            if cur in found:
                below.setdefault(cur, []).append(pid)
            cur, seen = parent.get(cur, 0), seen + 1
    out = []
    for pid in sorted(found)[:32]:
        uid, user = _owner(pid)
        out.append({"pid": pid, "uid": uid, "user": user, "command": _command(pid),
                    "tree": sorted(below.get(pid, []))[:256], "gpu_uuids": sorted(found[pid])})
    return out


def _on_path(name):
    return any(os.access(os.path.join(d, name), os.X_OK)
               for d in os.environ.get("PATH", "").split(os.pathsep) if d)
