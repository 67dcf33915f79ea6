"""Datasets: the same copy on every host, verified by content (``verify_data``) and
repaired from the first host, host to host (``sync_data``).

The names other packages use; each is imported from its module on first use (see
``multihost/lazy.py``), so importing the package loads none of it."""
from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {
    "verify_data": "verify", "sync_data": "repair", "data_error": "model", "describe": "model",
    "DataReport": "model", "DataSyncReport": "model",
    "HostData": "model", "HostDataSync": "model", "PathDiff": "model", "PathState": "model",
}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
