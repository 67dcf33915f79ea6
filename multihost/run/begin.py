"""Where a run begins, for ``multihost run`` and ``Cluster.run`` alike: attempt 0 up to
its launch, after a wait in line under ``--queue`` / ``queue=True``.

    life = begin(cluster, request, validated, notify)   # prepared: plan and record made
    outcome = life.run_to_end(listener_for)                # the CLI; the API follows in a thread

Which hosts, which view and what is said are the caller's; the run's steps are
``lifecycle.py``'s, the line itself (tickets in every host's registry) ``queue.py``'s.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..errors import CheckError
from .lifecycle import Lifecycle
from .request import RunRequest, Validated
from ..registry.queue import ticket_for

Notify = Callable[[str], None]


def begin(cluster, request: RunRequest, validated: Optional[Validated] = None,
          notify: Notify = lambda text: None, *, sync_view=None) -> Lifecycle:
    """The run's Lifecycle, prepared (``life.plan``, ``life.record``) on ``cluster`` (the
    caller's, never closed here); on any failure the Lifecycle is closed and the error
    raised: nothing was launched."""
    life = Lifecycle(cluster, request, validated, notify=notify)
    try:
        prepare_in_line(cluster, life, request, notify, sync_view=sync_view)
    except BaseException:
        life.close()
        raise
    return life


def prepare_in_line(cluster, life: Lifecycle, request: RunRequest, say: Notify, **prepare):
    """``life.attempt(0, **prepare)`` once it is the run's turn (``request.queue``) or at
    once. Another run that took the hosts in the moment between the turn and the check
    sends it back to its place (the front: it asked first), not into a failure."""
    ticket = ticket_for(cluster, request.job, request.job.start_port, request.name) \
        if request.queue else None
    while True:
        if ticket is not None:
            ticket.wait_turn(say)
        try:
            return life.attempt(0, **prepare)
        except CheckError as error:
            if ticket is None or not error.cause.startswith("busy: "):
                raise
            say(f"{error.cause}: back in line")
        finally:
            if ticket is not None:
                ticket.leave()
