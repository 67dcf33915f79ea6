"""Runs: the plan of a job, its start on every host, following it to its end, and the
records of runs on the controller.

The names other packages use; each is imported from its module on first use (see
``multihost/lazy.py``), so importing the package loads none of it."""
from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {
    "build_plan": "plan", "RunOptions": "follow", "start_and_follow": "follow",
    "query": "control", "stop": "control", "decode_exit": "outcome", "describe": "outcome",
    "check_user_env": "env", "mask_argv": "env", "parse_assignment": "env",
    "parse_env_file": "env", "NodeRecord": "records", "RunRecord": "records",
    "host_to_dict": "records", "list_runs": "records", "load_run": "records",
    "new_run_id": "records",
}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
