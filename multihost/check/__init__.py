"""The preflight: can this exact cluster run this exact job? (``run_checks``; the
report's records in ``report``, rendered by ``views/check_view``.)"""
from . import checks  # registers every check (see registry)
from .parsers import fold_ranges
from .preflight import run_checks
from .report import FAIL, PASS, SKIP, WARN, CheckReport, CheckResult, HostReport

__all__ = ["FAIL", "PASS", "SKIP", "WARN", "CheckReport", "CheckResult", "HostReport",
           "fold_ranges", "run_checks"]
