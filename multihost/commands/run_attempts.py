"""Following a run to its end: one attempt (``follow_run``), or several under
`--max-restarts N` and spare hosts. Each attempt is a whole run as ``follow_run``
follows it (every host stopped at the first failure, the root cause named). In between,
the attempt is kept in the record, a lost host's node rank goes to a spare, the preflight
runs again (a host that died is found there, and a spare takes its place too), a spare
that took a rank gets the code and the setup step, and the run is launched again under
the same run id. The policy is ``run/restarts.py`` and ``spares.py``; the hosts are
contacted by ``run/replace.py``.
"""
from __future__ import annotations

import dataclasses
import sys


def run_attempts(cluster, request, validated, plan, record, args, limit: int) -> int:
    from ..run.records import load_run
    from ..run.restarts import attempt_log_dir, restartable
    from ..spares import may_restart

    run_log_dir = record.log_dir
    record = dataclasses.replace(record, max_restarts=limit,
                                 log_dir=attempt_log_dir(run_log_dir, 0, limit))
    first = cluster
    try:
        while True:
            outcome = follow_once(cluster, plan, record, args)
            result = outcome.result
            done = load_run(plan.run_id)
            lost = tuple(result.lost) if result is not None else ()
            if plan.attempt >= limit or not restartable(result) or not may_restart(
                    args.max_restarts, plan.attempt, bool(lost), len(done.spares)):
                return end_of_run(outcome, plan, args)
            following = next_attempt_on(cluster, request, validated, plan, done, result, args,
                                        attempt_log_dir(run_log_dir, plan.attempt + 1, limit))
            if cluster is not first and following[0] is not cluster:
                cluster.close()
            cluster, plan, record = following
    finally:
        if cluster is not first:
            cluster.close()


def next_attempt_on(cluster, request, validated, plan, done, result, args, log_dir):
    """(cluster, plan, record) of the next attempt: lost hosts replaced by spares, the
    preflight passed (spares in the place of hosts that fail it), spares made ready.
    Raises RunFailed, naming the failed attempt and what stops the next, when it cannot."""
    from ..errors import MultihostError, RunFailed
    from ..run.records import host_from_dict
    from ..run.outcome import describe
    from ..run.pipeline import node_records, plan_for
    from ..run.replace import cluster_for, preflight_with_spares, ready_spares, same_shape
    from ..run.restarts import attempt_label, next_attempt
    from ..spares import Replacement, SpareState

    limit = done.max_restarts
    attempt = plan.attempt + 1
    label = attempt_label(plan.attempt, limit)
    lost = "".join(f"; {plan.nodes[r].host.label} was lost" for r in result.lost)
    _say(args, f"run {plan.run_id} {label} failed: {result.root_cause.host} "
               f"{describe(result.root_cause)}{lost}; restarting as "
               f"{attempt_label(attempt, limit)}")
    notify = lambda text: _say(args, text)  # noqa: E731
    state = SpareState(tuple(host_from_dict(h) for h in done.spares),
                       tuple(Replacement.from_json(r) for r in done.replacements))
    hosts = cluster.hosts
    for node in result.lost:
        swapped = state.replace(hosts, node, attempt, "lost")
        if swapped is not None:
            hosts, state = swapped
            notify(state.replacements[-1].line)
    fresh = cluster_for(cluster, hosts)
    try:
        report = None
        if not args.no_check:
            fresh, report, state = preflight_with_spares(
                fresh, validated.job, state, attempt, allow_concurrent=args.allow_concurrent,
                notify=notify, original=cluster)
        taken = {r.node_rank for r in state.replacements if r.attempt == attempt}
        ready_spares(fresh, validated.job, [h for h in fresh.hosts if h.rank in taken],
                     sync=request.sync, setup=request.setup,
                     setup_always=request.setup_always, notify=notify)
        start_port = report.start_port if report and report.start_port else plan.start_port
        following = dataclasses.replace(
            plan_for(fresh, request, validated, report, plan.run_id, start_port),
            attempt=attempt)
        same_shape(validated.job, [n.host for n in plan.nodes], fresh.hosts)
    except MultihostError as err:
        # The next attempt cannot start (a lost host is still gone and no spare is left):
        # the run ends with the status of the attempt that failed, and names what stops it.
        if fresh is not cluster:
            fresh.close()
        raise RunFailed(f"run {plan.run_id} failed ({label}: {describe(result.root_cause)}"
                        f"{lost}); it cannot restart: {err.cause}", host=err.host,
                        fix=err.fix, exit_code=result.exit_code) from None
    record = dataclasses.replace(
        next_attempt(done, log_dir, start_port, nodes=node_records(following)),
        replacements=tuple(r.to_json() for r in state.replacements),
        spares=tuple(dict(h) for h in _pool_dicts(state)))
    return fresh, following, record


def _pool_dicts(state):
    from ..run.records import host_to_dict

    return [host_to_dict(h) for h in state.pool]


def _say(args, text: str) -> None:
    if not args.json:
        print(f"multihost: {text}", file=sys.stderr, flush=True)


def follow_run(cluster, plan, record, args) -> int:
    return end_of_run(follow_once(cluster, plan, record, args), plan, args)


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
