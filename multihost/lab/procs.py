"""Processes seen from the root namespaces, through /proc.

A pid alone may be reused; the lab keeps (pid, start time) pairs and only ever signals a
pid whose start time still matches. Nothing here kills by name.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # clock ticks since boot (field 22 of /proc/PID/stat)


def _stat_fields(pid: int) -> Optional[List[str]]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2:].split()


def start_time(pid: int) -> Optional[int]:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def proc(pid: int) -> Optional[Proc]:
    start = start_time(pid)
    return Proc(pid, start) if start is not None else None


def alive(p: Proc) -> bool:
    """True while the very process recorded runs (a zombie counts as gone)."""
    fields = _stat_fields(p.pid)
    return bool(fields) and fields[0] != "Z" and int(fields[19]) == p.start


def running(pid: int) -> bool:
    """True while some process (not a zombie) has this pid: for a pid just started."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def all_pids() -> List[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def children(parents: Iterable[int]) -> Dict[int, List[int]]:
    """Direct children of each parent, by one scan of /proc (this kernel has no
    /proc/PID/task/TID/children)."""
    wanted = set(parents)
    found: Dict[int, List[int]] = {p: [] for p in wanted}
    for pid in all_pids():
        fields = _stat_fields(pid)
        if fields and int(fields[1]) in wanted:
            found[int(fields[1])].append(pid)
    return found


def netns_inode(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def in_netns(inodes: Set[int]) -> List[int]:
    """Pids of every process whose network namespace is one of ``inodes``."""
    pids = []
    for pid in all_pids():
        try:
            link = os.readlink(f"/proc/{pid}/ns/net")  # "net:[4026532290]"
        except OSError:
            continue
        if int(link[5:-1]) in inodes:
            pids.append(pid)
    return pids


def ancestors() -> Set[int]:
    """This process and its ancestors: never ours to kill, even inside a lab namespace."""
    chain, pid = set(), os.getpid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        fields = _stat_fields(pid)
        if not fields:
            break
        pid = int(fields[1])
    return chain


def kill_all(procs: Iterable[Proc], timeout: float = 5.0) -> List[Proc]:
    """SIGKILL each recorded process that is still itself; wait until all are gone.
    Returns those still alive at the deadline."""
    targets = [p for p in procs if alive(p)]
    for p in targets:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in targets if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


def send(p: Proc, sig: int) -> bool:
    if not alive(p):
        return False
    try:
        os.kill(p.pid, sig)
    except ProcessLookupError:
        return False
    return True
