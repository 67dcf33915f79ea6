"""Spare hosts at run time: the preflight that puts a spare in place of a host that fails
it, the spares' own check (a dead spare is a warning, never "not ready"), and a spare made
ready (code synced, setup run) before it starts.

The choice itself (which spare, which node rank, the host list after) is pure and lives
in ``multihost/spares.py``; this module only contacts hosts. A cluster is keyed by node
rank, so a host list with a spare in it gets a HostGroup of its own (``cluster_for``).
"""
from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence, Tuple

from ..errors import CheckError
from ..fanout import HostGroup
from ..hosts import Host
from ..job import JobOptions
from ..spares import SpareState

Notify = Callable[[str], None]
# Checks between hosts: among the spares alone they test peers the spare will never have
# (the check that runs again once a spare takes a rank tests its real ones).
BETWEEN_HOSTS = ("rendezvous", "ping")


def cluster_for(cluster: HostGroup, hosts: Sequence[Host]) -> HostGroup:
    """``cluster`` itself when it holds exactly these hosts, else a new one with the same
    ssh options (its connections open on first use)."""
    if tuple(hosts) == tuple(cluster.hosts):
        return cluster
    return HostGroup(hosts, cluster.options, workers=cluster.workers)


def check_spares(cluster: HostGroup, spares: Sequence[Host], job: JobOptions,
                 notify: Notify) -> Tuple[str, ...]:
    """The spares' own preflight: the label of every spare that fails it, each told
    through ``notify`` as a warning line (the job's hosts are judged apart)."""
    if not spares:
        return ()
    from ..check.preflight import run_checks
    from ..check.report import FAIL

    with HostGroup(spares, cluster.options, workers=cluster.workers) as own:
        report = run_checks(own, job)
    bad = []
    for host_report in report.hosts:
        failures = [r for r in host_report.results
                    if r.status == FAIL and r.name not in BETWEEN_HOSTS]
        if failures:
            first = failures[0]
            fix = f" (fix: {first.fix})" if first.fix else ""
            notify(f"warning: spare {host_report.host.label} is not usable: "
                   f"{first.name}: {first.detail}{fix}")
            bad.append(host_report.host.label)
    return tuple(bad)


def checked_in_background(cluster: HostGroup, spares: Sequence[Host], job: JobOptions,
                          notify: Notify) -> Callable[[], Tuple[str, ...]]:
    """``check_spares`` beside the job's own preflight; call the result to wait for it."""
    if not spares:   # no thread for nothing to check (every run without spares)
        return lambda: ()
    box = {"bad": ()}

    def work() -> None:
        try:
            box["bad"] = check_spares(cluster, spares, job, notify)
        except Exception as exc:  # a spare's check never stops the job's
            notify(f"warning: the spares could not be checked: {exc}")

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return lambda: (thread.join(), box["bad"])[1]


def preflight_with_spares(cluster: HostGroup, job: JobOptions, state: SpareState, attempt: int,
                          *, allow_concurrent: bool = False, notify: Notify,
                          original: Optional[HostGroup] = None,
                          known_bad: Callable[[], Sequence[str]] = lambda: ()):
    """The preflight of ``cluster``; while it fails on a host and a spare is left, that
    host's node rank goes to the next spare and the check runs again (a spare that fails
    in turn gives its place to the next). Returns (cluster, report, state); raises the
    last failure when no spare is left. ``known_bad`` names the spares whose own check
    failed (asked at the first replacement). Clusters made here are closed when replaced."""
    from .steps import preflight

    while True:
        try:
            report = preflight(cluster, job, allow_concurrent=allow_concurrent, notify=notify)
            return cluster, report, state
        except CheckError as err:
            if not state.replacements:
                state = state.drop(known_bad())
            node = next((h.rank for h in cluster.hosts if h.label == err.host), None)
            if node is None or not state.pool:
                if state.replacements and not state.pool:
                    raise CheckError(f"{err.cause}; no spare is left", host=err.host,
                                     fix=err.fix) from None
                raise
            hosts, state = state.replace(cluster.hosts, node, attempt, "check")
            notify(f"{err.host} failed the check ({err.cause}): "
                   f"{state.replacements[-1].line}")
            if cluster is not original:
                cluster.close()
            cluster = cluster_for(cluster, hosts)


def ready_spares(cluster: HostGroup, job: JobOptions, hosts: Sequence[Host], *, sync: bool,
                 setup: Optional[str], setup_always: bool, notify: Notify) -> None:
    """The code synced to the spares that just took a rank (and their data verified, and
    the setup step run), before the next attempt starts; the other hosts keep theirs."""
    if not hosts:
        return
    from .steps import setup as run_setup, sync_for_run

    with HostGroup(hosts, cluster.options, workers=cluster.workers) as own:
        sync_for_run(own, job, code=sync, data_checked=False, notify=notify)
        run_setup(own, job, setup, always=setup_always, notify=notify)


def same_shape(job: JobOptions, before: Sequence[Host], after: Sequence[Host]) -> None:
    """A spare runs the processes of the node it replaces, or the world would change
    size and every rank after it would move."""
    from ..errors import ConfigError

    for old, new in zip(before, after):
        if job.nproc_for(old) != job.nproc_for(new):
            raise ConfigError(f"spare {new.label} would run {job.nproc_for(new)} process(es) "
                              f"where node {old.rank} ran {job.nproc_for(old)}",
                              host=new.label,
                              fix="give the spare the same gpus/slots as the hosts, or none "
                                  "(it then takes those of the node it replaces)")
