"""``multihost run --max-restarts N``: the attempts of one run, one after the other.

Each attempt is a whole run as ``run`` follows it without restarts (start_and_follow: every
host stopped at the first failure, the root cause named). What this adds in between: the
attempt kept in the record, the preflight again (a host that died is found there), and
the launch again under the same run id with the attempt counted up. The policy itself
(what is restarted, where each attempt's logs go) is restarts.py.
"""
from __future__ import annotations

import dataclasses
import sys


def _say(args, text: str) -> None:
    if not args.json:
        print(f"multihost: {text}", file=sys.stderr, flush=True)


def run_attempts(cluster, job, plan, record, args) -> int:
    from ..errors import MultihostError, RunFailed
    from ..run.restarts import attempt_label, attempt_log_dir, next_attempt, restartable
    from ..run.outcome import describe
    from ..run.records import load_run
    from ..run.pipeline import preflight
    from .run import end_of_run, follow_once

    limit = args.max_restarts
    run_log_dir = record.log_dir
    record = dataclasses.replace(record, max_restarts=limit,
                                 log_dir=attempt_log_dir(run_log_dir, 0, limit))
    while True:
        outcome = follow_once(cluster, plan, record, args)
        result = outcome.result
        if plan.attempt >= limit or not restartable(result):
            return end_of_run(outcome, plan, args)
        done = load_run(plan.run_id)
        label = attempt_label(plan.attempt, limit)
        lost = "".join(f"; {plan.nodes[r].host.label} was lost" for r in result.lost)
        _say(args, f"run {plan.run_id} {label} failed: {result.root_cause.host} "
                   f"{describe(result.root_cause)}{lost}; restarting as "
                   f"{attempt_label(plan.attempt + 1, limit)}")
        try:
            report = None if args.no_check else preflight(
                cluster, job, allow_concurrent=args.allow_concurrent,
                notify=lambda text: _say(args, text))
        except MultihostError as err:
            # The next attempt cannot start (a lost host is still gone): the run ends with
            # the status of the attempt that failed, and names what stops the next one.
            raise RunFailed(f"run {plan.run_id} failed ({label}: {describe(result.root_cause)}"
                            f"{lost}); it cannot restart: {err.cause}", host=err.host,
                            fix=err.fix, exit_code=result.exit_code) from None
        start_port = report.start_port if report and report.start_port else plan.start_port
        plan = dataclasses.replace(plan, attempt=plan.attempt + 1, start_port=start_port)
        record = next_attempt(done, attempt_log_dir(run_log_dir, plan.attempt, limit),
                              start_port)
