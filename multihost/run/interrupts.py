"""Ctrl-C while a run is followed: counted, not raised, so the run is stopped on every
host in order (the first gracefully, the second at once) instead of the controller dying
mid-sentence with the ranks left running."""
from __future__ import annotations

import signal
import threading
from typing import Optional


class Interrupts:
    """Counts SIGINTs while installed (the first stops gracefully, the second at once)."""

    def __init__(self) -> None:
        self.count = 0
        self.detached = False     # stop following; the run goes on
        self.reason: Optional[str] = None   # set by a stop that is not a Ctrl-C (the dashboard)
        self._previous = {}

    def __call__(self) -> bool:
        return self.count > 0

    def _handle(self, signum, frame) -> None:
        self.count += 1

    def __enter__(self) -> "Interrupts":
        # SIGTERM (`timeout`, a batch system ending the controller) counts as a Ctrl-C:
        # the run is stopped on every host. SIGKILL can not be caught: the run goes on.
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
