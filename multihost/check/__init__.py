"""The preflight: can this exact cluster run this exact job? (``run_checks``; the
report's records in ``report``, rendered by ``views/check_view``.)

The names other packages use; each is imported from its module on first use (see
``multihost/lazy.py``), so importing the package loads none of it."""
from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {
    "run_checks": "preflight", "CheckReport": "report", "CheckResult": "report",
    "HostReport": "report", "CHECKS": "report", "PASS": "report", "WARN": "report",
    "FAIL": "report", "SKIP": "report", "fold_ranges": "parsers",
}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
