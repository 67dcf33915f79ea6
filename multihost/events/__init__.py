"""Every event multihost emits, and the one type that takes them (Listener): small frozen
records, produced by the engines (the run monitor, the log follower, sync, data sync,
the check) and consumed by the views (dashboard, plain lines, JSON lines, progress).

Data flows one way: hosts -> spec -> per-node records -> events -> views. A view never
reaches back into the run; it only renders what it was told.

They live in this one package rather than beside each engine so that a view, a test or
an embedding program finds every event it may be handed in one place
(``from multihost.events import NodeChanged``), and so that an engine and the views that
render it never import each other. Events that carry a feature's result (SyncPlanned,
SyncHostDone) name its type only for the type checker: this package imports no feature
package.

One module per feature (``run``, ``sync``, ``check``), each loaded on first use (see
``multihost/lazy.py``): a frozen dataclass costs about 1-2 ms to create at start-up, so a
sync that finds nothing to do creates its four events, not all sixteen.
"""
from __future__ import annotations

from typing import Callable

from ..lazy import lazy_names

# Whatever takes events: a view, a filter in front of one, a test's list.append.
Listener = Callable[[object], None]

_LAZY = {
    "NodeState": "run", "RunState": "run", "RunStarted": "run", "NodeChanged": "run",
    "who": "run", "LogLine": "run", "LogBlock": "run", "Notice": "run", "GpuSample": "run",
    "RootCause": "run", "RunStopping": "run", "RunFinished": "run", "Stragglers": "run",
    "SyncScanned": "sync", "SyncPlanned": "sync", "SyncHostDone": "sync",
    "SyncProgress": "sync", "DataProgress": "sync", "CheckStage": "check",
}
__all__ = sorted(["Listener", *_LAZY])
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
