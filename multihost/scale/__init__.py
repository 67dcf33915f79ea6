"""Scaling: one job measured on 1, 2, 4, ... hosts and on all of them, each point an
ordinary run, its throughput read from the logs, and the table of speed-up and scaling
efficiency the reference docs print.

The names other packages use; each is imported from its module on first use (see
``multihost/lazy.py``), so importing the package loads none of it."""
from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {
    "plan_counts": "plan", "parse_counts": "plan",
    "MetricReader": "measure", "Samples": "measure", "Throughput": "measure",
    "parse_metric_is": "measure",
    "ScalePoint": "table", "ScaleRow": "table", "ScaleTable": "table",
    "ScaleOptions": "runner", "scale_points": "runner",
}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
