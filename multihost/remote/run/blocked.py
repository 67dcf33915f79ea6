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
names); it is blocked when its main thread sleeps in a futex and the process used no
CPU time for ``settle`` seconds. A rank saving a checkpoint computes or writes (R or D,
CPU time going by) and is waited for, as is anything that is not a rank: the kill wait
is theirs.
"""
import os

# torch names these threads (15 characters at most, as the kernel keeps them).
COLLECTIVE_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop", "pt_nccl_watchdg",
                      "pt_nccl_heartbt", "pt_nccl_watchdo")
SETTLE = 1.0            # seconds a rank stays blocked, with no CPU time, before it counts
IDLE_TICKS = 2          # CPU ticks a blocked rank may use meanwhile (gloo's loop polls)


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


def rank_wait(pid):
    """(ticks, blocked) of a distributed rank: its CPU ticks, and whether its main
    thread sleeps in a futex now. None for a process that is not a rank, or is gone."""
    try:
        tids = [int(t) for t in os.listdir("/proc/%d/task" % pid)]
    except (OSError, ValueError):
        return None
    names = set(_read("/proc/%d/task/%d/comm" % (pid, tid)).strip() for tid in tids)
    if not names.intersection(COLLECTIVE_THREADS):
        return None
    ticks, main_state = 0, None
    for tid in tids:
        stat = _task_stat(pid, tid)
        if stat is None:
            continue
        ticks += stat[1]
        if tid == pid:
            main_state = stat[0]
    in_futex = _read("/proc/%d/wchan" % pid).startswith("futex")
    return ticks, main_state == "S" and in_futex


class BlockedRanks(object):
    """Watches a stop: ``check(procs, now)`` is True once every rank among ``procs``
    ({pid: (pgid, ticks)}, the run's live processes) has been blocked for SETTLE s."""

    def __init__(self, settle=SETTLE):
        self.settle = settle
        self.since = {}     # pid -> (time first seen blocked, its ticks then)
        self.ranks = 0      # ranks seen blocked when check last said True
        self.waiting = []   # pids of the ranks still doing something, at the last check

    def check(self, procs, now):
        blocked, waiting = 0, []
        for pid in sorted(procs):
            main = _task_stat(pid, pid)
            if main is not None and main[0] == "D":
                waiting.append(pid)     # anything writing to a disk is waited for
                continue
            wait = rank_wait(pid)
            if wait is None:
                continue
            ticks, in_futex = wait
            first = self.since.get(pid)
            if not in_futex or (first is not None and ticks - first[1] > IDLE_TICKS):
                self.since.pop(pid, None)
                waiting.append(pid)
                continue
            if first is None:
                self.since[pid] = first = (now, ticks)
            if now - first[0] < self.settle:
                waiting.append(pid)
                continue
            blocked += 1
        self.waiting = waiting
        if blocked and not waiting:
            self.ranks = blocked
            return True
        return False
