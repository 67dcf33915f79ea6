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

One module per feature (``run``, ``sync``, ``check``).
"""
from __future__ import annotations

from typing import Callable

from .check import CheckStage
from .run import (GpuSample, LogBlock, LogLine, LogProgress, NodeChanged, NodeState, Notice,
                  RootCause, RunFinished, RunStarted, RunState, RunStopping, Stragglers, who)
from .sync import (DataProgress, SyncHostDone, SyncPlanned, SyncProgress, SyncScanned,
                   SyncWaiting)

# Whatever takes events: a view, a filter in front of one, a test's list.append.
Listener = Callable[[object], None]

__all__ = ["CheckStage", "DataProgress", "GpuSample", "Listener", "LogBlock", "LogLine",
           "LogProgress", "NodeChanged", "NodeState", "Notice", "RootCause", "RunFinished",
           "RunStarted", "RunState", "RunStopping", "Stragglers", "SyncHostDone", "SyncPlanned",
           "SyncProgress", "SyncScanned", "SyncWaiting", "who"]
