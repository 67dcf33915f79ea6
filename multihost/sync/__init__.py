"""Code sync: the code directory made identical in every host's workdir
(``sync_code``), and the streams that move files to hosts (used by ``data`` too).

The names other packages use; each is imported from its module on first use (see
``multihost/lazy.py``), so importing the package loads none of it."""
from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {
    "sync_code": "pipeline", "SyncReport": "model", "HostSync": "model", "HostNeeds": "model",
    "build_manifest": "manifest", "code_revision": "manifest", "human_bytes": "manifest",
    "call_streaming": "transfer", "hop_spec": "transfer",
    "pipe_errors_raise": "transfer", "stream_to": "transfer",
    "MIRROR_MARKER": "ignore",
}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
