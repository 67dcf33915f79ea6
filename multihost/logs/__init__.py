"""Logs: every rank's lines followed from the hosts (``LogFollower``), mirrored to
``./log`` and read back from there, and the metrics parsed from them.

The names other packages use; each is imported from its module on first use (see
``multihost/lazy.py``), so importing the package loads none of it."""
from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {
    "LogFollower": "follow", "ensure_private": "follow", "nodes_of": "follow",
    "LineFilter": "mirror", "parse_ranks": "mirror", "parse_since": "mirror",
    "read_mirror": "mirror", "Metrics": "metrics", "parse_metrics": "metrics",
}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
