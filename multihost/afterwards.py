"""Work that only makes a later command faster, done after the user has their answer.

A sync ends by saving the snapshot of the code directory that lets the next one skip
the walk (sync/snapshot.py): 3-6 ms of writing and renaming 400 KB for 2,000 files, and
on a busy disk a rename can wait tens of milliseconds. Nothing the user asked for
depends on it: a snapshot that is missing or old only costs the next sync a walk, and
every such file is written whole or not at all (a temporary file, then a rename). Git
does the same with its housekeeping (`gc --auto` runs detached, after the command).

A command run by the warm controller (warm/worker.py) collects such work with
``defer``, reports its exit status as soon as its own work is done, and then does the
deferred work before its process ends (its CPU is still counted: the controller logs
each command's whole process). Anywhere else, ``defer`` runs the work at once, where it
always ran: a cold command's user waits for it as before, and the Python API's callers
find the snapshot saved when the call returns.
"""
from __future__ import annotations

from typing import Callable, List, Optional

_pending: Optional[List[Callable[[], None]]] = None


def defer(work: Callable[[], None]) -> None:
    """Run ``work`` once the command's answer is out (see the module's doc)."""
    if _pending is None:
        work()
    else:
        _pending.append(work)


def collect() -> None:
    """From now on, ``defer`` keeps the work for ``run_deferred`` (one command's process)."""
    global _pending
    _pending = []


def pending() -> bool:
    return bool(_pending)


def run_deferred() -> None:
    """Do the work kept so far, in order; a failure ends none of the rest (it could
    only cost a later command time, and there is nobody left to tell)."""
    global _pending
    work, _pending = _pending or [], None
    for step in work:
        try:
            step()
        except Exception:  # noqa: BLE001 (see the doc: nothing depends on it)
            pass
