"""Following a run to its end under ``--max-restarts N`` and spare hosts, for the CLI and
the Python API alike. Each attempt is a whole run as ``follow_once`` follows it (every
host stopped at the first failure, the root cause named). In between, the attempt is
kept in the record, a lost host's node rank goes to a spare, the preflight runs again (a
host that died is found there, and a spare takes its place too), a spare that took a
rank gets the code and the setup step, and the run is launched again under the same run
id. The policy is ``restarts.py`` and ``spares.py``; the hosts are contacted by
``replace.py``. How an attempt is shown is the caller's: ``follow_once`` (a view for the
CLI, the event queue for the API).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .follow import Outcome

Notify = Callable[[str], None]
FollowOnce = Callable[..., Outcome]   # (cluster, plan, record) -> the attempt's Outcome


def follow_attempts(cluster, request, validated, plan, record, follow_once: FollowOnce,
                    notify: Notify):
    """(outcome, plan) of the last attempt: the first one alone, or restarts while the
    budget (``request.max_restarts``, else one per spare) and the policy allow. Raises
    RunFailed, naming the failed attempt and what stops the next, when one cannot
    start. Clusters made here for spares are closed here; ``cluster`` is the caller's."""
    from ..spares import may_restart, restart_budget
    from .records import load_run
    from .restarts import attempt_log_dir, restartable

    limit = restart_budget(request.max_restarts, len(record.spares))
    if not limit or request.detach:
        return follow_once(cluster, plan, record), plan
    run_log_dir = record.log_dir
    record = dataclasses.replace(record, max_restarts=limit,
                                 log_dir=attempt_log_dir(run_log_dir, 0, limit))
    first = cluster
    try:
        while True:
            outcome = follow_once(cluster, plan, record)
            result = outcome.result
            done = load_run(plan.run_id)
            lost = tuple(result.lost) if result is not None else ()
            if plan.attempt >= limit or not restartable(result) or not may_restart(
                    request.max_restarts, plan.attempt, bool(lost), len(done.spares)):
                return outcome, plan
            following = next_attempt_on(cluster, request, validated, plan, done, result,
                                        attempt_log_dir(run_log_dir, plan.attempt + 1, limit),
                                        notify)
            if cluster is not first and following[0] is not cluster:
                cluster.close()
            cluster, plan, record = following
    finally:
        if cluster is not first:
            cluster.close()


def next_attempt_on(cluster, request, validated, plan, done, result, log_dir, notify: Notify):
    """(cluster, plan, record) of the next attempt: lost hosts replaced by spares, the
    preflight passed (spares in the place of hosts that fail it), spares made ready.
    Raises RunFailed, naming the failed attempt and what stops the next, when it cannot."""
    from ..errors import MultihostError, RunFailed
    from ..spares import Replacement, SpareState
    from .outcome import describe
    from .pipeline import node_records, plan_for
    from .records import host_from_dict, host_to_dict
    from .replace import cluster_for, preflight_with_spares, ready_spares, same_shape
    from .restarts import attempt_label, next_attempt

    limit = done.max_restarts
    attempt = plan.attempt + 1
    label = attempt_label(plan.attempt, limit)
    lost = "".join(f"; {plan.nodes[r].host.label} was lost" for r in result.lost)
    notify(f"run {plan.run_id} {label} failed: {result.root_cause.host} "
           f"{describe(result.root_cause)}{lost}; restarting as {attempt_label(attempt, limit)}")
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
        if request.check:
            fresh, report, state = preflight_with_spares(
                fresh, validated.job, state, attempt, allow_concurrent=request.allow_concurrent,
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
        spares=tuple(host_to_dict(h) for h in state.pool))
    return fresh, following, record
