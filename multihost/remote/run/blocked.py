"""Ranks that a stop's SIGTERM cannot end: blocked in a collective that their peers will
never join. Stdlib only, Python 3.6+.

A distributed rank's SIGTERM handler runs only when its main thread is back in Python.
Lightning's handler itself broadcasts to every rank; a rank that the signal finds inside
DDP's gradient all-reduce waits there for peers that took the signal elsewhere and left
the step. Such a rank sits in a futex with no CPU time going by until the kill wait
ends: the whole wait is lost, and nothing is saved by it. ``BlockedRanks`` tells the
supervisor when every rank left on the host is in that state, long enough to be sure,
so that it kills at once instead, and says why.

A rank is a process with torch.distributed's own threads (gloo's or NCCL's, by their
names); it is blocked when its main thread sleeps in a futex and used no CPU time for
``settle`` seconds (gloo's own threads poll, and are not counted). A rank saving a checkpoint computes or writes (R or D,
CPU time going by) and is waited for, as is anything that is not a rank: the kill wait
is theirs.
"""
import os

# torch names these threads (15 characters at most, as the kernel keeps them).
COLLECTIVE_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop", "pt_nccl_watchdg",
                      "pt_nccl_heartbt", "pt_nccl_watchdo")
SETTLE = 1.0            # seconds a rank stays blocked, with no CPU time, before it counts
IDLE_TICKS = 2          # CPU ticks a blocked rank's main thread may use meanwhile


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (OSError, IOError):
        return ""


def _task_stat(pid, tid):
    """(state, utime + stime) of one thread, or None when it is gone."""
    raw = _read("/proc/%d/task/%d/stat" % (pid, tid))
    fields = raw.rpartition(")")[2].split()
    if len(fields) < 13:
        return None
    return fields[0], int(fields[11]) + int(fields[12])


def rank_wait(pid, known=False):
    """(ticks, blocked) of a distributed rank: its main thread's CPU ticks (gloo's own
    threads poll), and whether that thread sleeps in a futex now. None for a process
    that is not a rank (``known``: it was one, and may be ending its threads), or is gone."""
    try:
        tids = [int(t) for t in os.listdir("/proc/%d/task" % pid)]
    except (OSError, ValueError):
        return None
    names = set(_read("/proc/%d/task/%d/comm" % (pid, tid)).strip() for tid in tids)
    if not known and not names.intersection(COLLECTIVE_THREADS):
        return None
    main = _task_stat(pid, pid)
    if main is None:
        return None
    in_futex = _read("/proc/%d/wchan" % pid).startswith("futex")
    return main[1], main[0] == "S" and in_futex


class BlockedRanks(object):
    """Watches a stop: ``check(procs, now)`` is True once every rank among ``procs``
    ({pid: (pgid, ticks)}, the run's live processes) has been blocked for SETTLE s."""

    def __init__(self, settle=SETTLE):
        self.settle = settle
        self.since = {}     # pid -> (time first seen blocked, its ticks then)
        self.ranks = 0      # ranks seen blocked when check last said True
        self.waiting = []   # pids of the ranks still doing something, at the last check
        self.held = []      # pids of ranks blocked, not yet for ``settle`` s
        self.others = []    # pids of processes that are not ranks (a launcher, a wrapper)
        self.known = set()  # pids seen as ranks: one ending its process group still is one
        self.doing = {}     # pid -> what a working rank's main thread was last seen doing

    def check(self, procs, now):
        blocked, waiting, held, others = 0, [], [], []
        for pid in sorted(procs):
            main = _task_stat(pid, pid)
            if main is not None and main[0] == "D":
                waiting.append(pid)     # anything writing to a disk is waited for
                continue
            wait = rank_wait(pid, known=pid in self.known)
            if wait is None:
                others.append(pid)
                continue
            self.known.add(pid)
            ticks, in_futex = wait
            first = self.since.get(pid)
            if not in_futex or (first is not None and ticks - first[1] > IDLE_TICKS):
                self.since.pop(pid, None)
                waiting.append(pid)
                self.doing[pid] = _doing(pid, main, in_futex)
                continue
            if first is None:
                self.since[pid] = first = (now, ticks)
            if now - first[0] < self.settle:
                held.append(pid)
                continue
            blocked += 1
        self.waiting, self.held, self.others = waiting, held, others
        if blocked and not waiting and not held:
            self.ranks = blocked
            return True
        return False

    def summary(self, kill_in):
        """What the stop waits for, in one line for the user, or '' for nothing."""
        parts = []
        if self.waiting:
            parts.append("%s still working after SIGTERM (%s)" % (
                _pids(self.waiting, "rank"), self.doing.get(self.waiting[0], "writing to disk")))
        if self.held:
            parts.append("%s blocked in a collective, killed if still so in %g s" % (
                _pids(self.held, "rank"), self.settle))
        if self.others and not (self.waiting or self.held):
            parts.append("%s still running after SIGTERM" % _pids(self.others, "process",
                                                                    named=True))
        if not parts:
            return ""
        return "stop waits for %s; SIGKILL in %d s" % ("; ".join(parts), max(0, int(kill_in + 0.5)))


def _doing(pid, main, in_futex):
    """A rank's main thread in a few words: ``computing`` or ``waiting in do_epoll_wait``."""
    if main is None or main[0] == "R":
        return "computing"
    if main[0] == "D":
        return "writing to disk"
    if in_futex:
        return "waiting on a lock, its CPU time going by"
    return "waiting in %s" % (_read("/proc/%d/wchan" % pid).strip()[:40] or "the kernel")


def _pids(pids, what, named=False):
    names = ""
    if named:
        names = " (%s)" % ", ".join(sorted(set(_command(pid) for pid in pids))[:3])
    return "%d %s%s %s%s" % (len(pids), what, "" if len(pids) == 1 else "es" if what == "process"
                             else "s", "pid" if len(pids) == 1 else "pids",
                             " " + ", ".join(str(p) for p in pids[:4])) + names


def _command(pid):
    """A process's program and script, short: ``python train.py``."""
    words = _read("/proc/%d/cmdline" % pid).split("\0")
    words = [os.path.basename(w) for w in words if w][:4]
    shown = [w for w in words if not w.startswith("-")][:2]
    return " ".join(shown)[:60] or "?"
