"""How ``multihost run`` follows a run to its end: each attempt drawn by a view (the
dashboard, plain lines or JSON), the restarts of ``--max-restarts N`` and spare hosts
left to ``run/attempts.py`` (shared with the Python API), and the end turned into the
exit status or the one-line error that names the root cause.
"""
from __future__ import annotations

import dataclasses
import sys


def run_attempts(cluster, request, validated, plan, record, args) -> int:
    from ..run.attempts import follow_attempts

    outcome, plan = follow_attempts(
        cluster, request, validated, plan, record,
        lambda cluster, plan, record: follow_once(cluster, plan, record, args),
        notify=lambda text: _say(args, text))
    return end_of_run(outcome, plan, args)


def _say(args, text: str) -> None:
    if not args.json:
        print(f"multihost: {text}", file=sys.stderr, flush=True)


def follow_once(cluster, plan, record, args):
    from ..run.follow import RunOptions, start_and_follow
    from ..views import make_view

    mode = "json" if args.json else "plain" if args.plain or args.detach else "auto"
    holder = {}
    view = make_view(mode, on_stop=lambda: holder["controls"].stop(),
                     on_detach=lambda: holder["controls"].detach(),
                     by_rank=args.ranks) if mode == "auto" else make_view(mode)
    options = RunOptions(detach=args.detach, wait_after_exit=args.wait,
                         hang_timeout=args.hang_timeout)
    try:
        outcome = start_and_follow(cluster, plan, record, view, options, holder)
    finally:  # the dashboard gives the terminal back before anything else is printed
        getattr(view, "close", lambda: None)()
    return dataclasses.replace(outcome, stop_reason=holder["controls"].interrupts.reason or "")


def end_of_run(outcome, plan, args) -> int:
    """The exit status of the run, or the one-line error that names its root cause."""
    from ..run.pipeline import failure_of

    if outcome.detached:
        if args.json:
            return 0
        print(f"run {plan.run_id} is running on {len(plan.nodes)} host(s); from any shell:\n"
              f"  multihost status {plan.run_id}\n"
              f"  multihost logs {plan.run_id} --follow\n"
              f"  multihost stop {plan.run_id}")
        return 0
    error = failure_of(outcome, plan)
    if error is not None:
        raise error
    return 0
