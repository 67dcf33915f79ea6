"""Runs: the plan of a job, its start on every host, following it to its end, and the
records of runs on the controller."""
from .control import query, stop
from .env import check_user_env, mask_argv, parse_assignment, parse_env_file
from .execute import RunOptions, launch_and_watch
from .exits import decode_exit
from .outcome import describe
from .plan import build_plan
from .records import NodeRecord, RunRecord, host_to_dict, list_runs, load_run, new_run_id

__all__ = ["NodeRecord", "RunOptions", "RunRecord", "build_plan", "check_user_env",
           "decode_exit", "describe", "host_to_dict", "launch_and_watch", "list_runs",
           "load_run", "mask_argv", "new_run_id", "parse_assignment", "parse_env_file", "query",
           "stop"]
