"""The processes of a run on a host: find them, tell whether one still runs, signal and
stop them. Stdlib only, Python 3.6+ (this runs on the hosts).

A process belongs to a run when it descends from the run's supervisor or carries
MULTIHOST_RUN_ID=<run_id> in its environment. Nothing is ever found or killed by name.
A process is named by its pid and its start time (``/proc/<pid>/stat``), so a pid reused
by another program is never taken for the one recorded.
"""
import errno
import os
import signal
import time

MARKER = "MULTIHOST_RUN_ID"

def _stat(pid):
    """(state, ppid, pgid, start ticks) of a process, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            raw = f.read().decode("ascii", "replace")
        fields = raw[raw.rindex(")") + 2:].split()
        return fields[0], int(fields[1]), int(fields[2]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None  # gone between the listing and the read (an empty or cut read)


def start_ticks(pid):
    stat = _stat(pid)
    return stat[3] if stat else None


def is_alive(pid, ticks=None):
    """The very process recorded (same start time) still runs; a zombie counts as gone."""
    if not pid:
        return False
    stat = _stat(int(pid))
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return ticks is None or stat[3] == ticks


def _pid_namespace(pid="self"):
    try:
        return os.readlink("/proc/%s/ns/pid" % pid)
    except OSError:
        return None


def wrapper_alive(pid, ticks, namespace=None):
    """A rank wrapper still runs. One in a container (``run --image``) recorded the pid
    it has in there: on the host it is the process of that pid namespace whose pid in
    there (NSpid's last) and start time match. Where no process of the namespace can be
    read, it is not declared dead."""
    own = _pid_namespace()
    if not namespace or not own or namespace == own:
        return is_alive(pid, ticks)
    seen = False
    for host_pid in _all_pids():
        if _pid_namespace(host_pid) != namespace:
            continue
        seen = True
        if _ns_pid(host_pid) == pid and is_alive(host_pid, ticks):
            return True
    return not seen and _namespace_unreadable()


def _ns_pid(pid):
    """The pid a process has in its own (innermost) pid namespace."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _namespace_unreadable():
    """True when this user cannot read other processes' namespaces here (a hardened
    /proc): then a wrapper's absence proves nothing."""
    return not any(_pid_namespace(p) for p in _all_pids() if p != os.getpid())


def _all_pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def run_marker(pid):
    """The MULTIHOST_RUN_ID a process carries, or None (or unreadable: not ours)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = f.read()
    except OSError:
        return None
    prefix = ("%s=" % MARKER).encode()
    for entry in env.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode("utf-8", "replace")
    return None


def _has_marker(pid, run_id):
    return run_marker(pid) == run_id


def own_marked_processes(excluded=()):
    """{run_id: [pid, ...]} of this user's live processes that carry a run's marker.
    Another user's processes are never ours to report or stop, root's view included."""
    uid = os.getuid()
    found = {}
    for pid in _all_pids():
        if pid in excluded or not _owned(pid, uid):
            continue  # (a zombie's environ reads empty: it carries no marker)
        run_id = run_marker(pid)
        if run_id is not None:
            found.setdefault(run_id, []).append(pid)
    return found


def ancestors():
    """This process and its ancestors: the ssh session that runs us may carry a marker."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        stat = _stat(pid)
        pid = stat[1] if stat else 0
    return pids


def run_processes(run_id, root_pid=None):
    """{pid: (pgid, ticks)} of every live process of the run, never this process, the
    root itself, or any of our ancestors."""
    stats = {}
    for pid in _all_pids():
        stat = _stat(pid)
        if stat is not None and stat[0] not in ("Z", "X"):
            stats[pid] = stat
    excluded = set()
    pid = os.getpid()
    while pid > 1 and pid not in excluded:
        excluded.add(pid)
        pid = stats[pid][1] if pid in stats else 0
    if root_pid:
        excluded.add(root_pid)
    children = {}
    for pid, stat in stats.items():
        children.setdefault(stat[1], []).append(pid)
    found = set()
    todo = list(children.get(root_pid, [])) if root_pid else []
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    uid = os.getuid()
    for pid in stats:
        if pid not in found and pid not in excluded and _owned(pid, uid) and _has_marker(pid, run_id):
            found.add(pid)
    return {pid: (stats[pid][2], stats[pid][3]) for pid in found - excluded}


def _owned(pid, uid):
    """Run by this user. Root too asks this: a marker in another user's process (copied
    from an environment, or that user's own run) does not make it part of root's run."""
    try:
        return os.stat("/proc/%d" % pid).st_uid == uid
    except OSError:
        return False


def signal_processes(procs, sig, skip_groups=(), done_groups=None):
    """Send ``sig`` to each process group of ``procs`` once (so data-loader workers and
    other grandchildren get it too), and to single processes in ``skip_groups``."""
    done_groups = set() if done_groups is None else done_groups
    for pid, (pgid, _) in sorted(procs.items()):
        try:
            if pgid in skip_groups or pgid <= 1:
                os.kill(pid, sig)
            elif pgid not in done_groups:
                done_groups.add(pgid)
                os.killpg(pgid, sig)
        except OSError as err:
            if err.errno not in (errno.ESRCH, errno.EPERM):
                raise
    return done_groups


def terminate(run_id, root_pid, grace, kill_now=lambda: False, skip_groups=(), blocked=None):
    """SIGTERM to every process group of the run, up to ``grace`` seconds for them to
    go, then SIGKILL to whatever is left. Returns the number of processes killed hard.
    ``blocked`` (a blocked.BlockedRanks) ends the wait early once every rank left is
    stuck in a collective that no SIGTERM handler can leave."""
    procs = run_processes(run_id, root_pid)
    if not procs:
        return 0
    termed = signal_processes(procs, signal.SIGTERM, skip_groups)
    deadline = time.time() + max(0.0, grace)
    while procs and time.time() < deadline and not kill_now():
        time.sleep(0.05)
        procs = run_processes(run_id, root_pid)
        # Newcomers in a group not signalled yet (a fork racing the first signal).
        fresh = {p: v for p, v in procs.items() if v[0] not in termed}
        if fresh:
            signal_processes(fresh, signal.SIGTERM, skip_groups, termed)
        if procs and blocked is not None and blocked.check(procs, time.time()):
            break
    hard = 0
    for _ in range(100):  # SIGKILL cannot be ignored; a D-state process can take a while
        procs = run_processes(run_id, root_pid)
        if not procs:
            break
        hard = max(hard, len(procs))
        signal_processes(procs, signal.SIGKILL, skip_groups)
        time.sleep(0.05)
    return hard


def supervisor_alive(node):
    """The run's supervisor (recorded with its start time) is still running."""
    sup = (node or {}).get("supervisor") or {}
    return is_alive(sup.get("pid"), sup.get("ticks"))
