"""The life of one run, from the first check to its end: read this file first.

    life = Lifecycle(cluster, request, validated, notify)
    plan, record = life.prepare()        # attempt 0, up to its launch
    outcome = life.follow(listener_for)  # execute; restart while the policy allows
    life.close()

Every attempt goes through the same named steps (SkyPilot's backends have this shape:
provision, sync_workdir, setup, execute, teardown; torch elastic's agent has the loop):

    check    the preflight (``steps.preflight``); a host that fails it gives its node
             rank to the next spare, and the check runs again
    sync     the code to the hosts, the datasets verified: every host for attempt 0,
             only the spares that just took a rank for a restart (``steps.sync_for_run``)
    setup    the ``--setup`` command where it has not succeeded on this code (``steps.setup``)
    plan     node 0's address (the rendezvous), the ports, every node's command; the record
    execute  launch in ip order and follow to the end (``follow.start_and_follow``): the
             first failure stops every host and is named as the root cause
    decide   end, or restart (``restarts.py``: ``--max-restarts``, spares, the failure's kind;
             never after success, Ctrl-C, a stop from elsewhere or a detach)
    replace  a lost host's node rank to a spare (``spares.py``), then check, sync, setup,
             plan and execute again under the same run id, as attempt k

The states a run's record goes through are ``RunState``'s (its docstring draws them). The
end becomes the exit status, or the one line naming the root cause, in
``request.failure_of``. Nothing here parses flags or draws: the caller gives ``notify``
for the one-line notes and, per attempt, a listener for its events (a view, the API's
queue). The caller's cluster stays the caller's; clusters made here for spares are closed here.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Sequence

from ..errors import CheckError, ConfigError, MultihostError, RunFailed
from ..fanout import HostGroup
from ..hosts import Host
from ..job import JobOptions
from ..spares import Replacement, SpareState, spare_pool
from .follow import Outcome, RunOptions, start_and_follow
from .outcome import describe
from .request import (RunRequest, Validated, initial_record, node_records, plan_for,
                       revision_in_background, validate)
from .records import host_from_dict, host_to_dict, load_run, new_run_id
from .restarts import (attempt_label, attempt_log_dir, may_restart, next_attempt,
                       restart_budget, restartable)
from .steps import (checked_in_background, in_place_if_shared, preflight, setup,
                    sync_for_run)

Notify = Callable[[str], None]


def _quiet(text: str) -> None:
    pass


class Lifecycle:
    """One run on ``cluster``'s hosts: ``prepare`` (attempt 0 up to its launch), then
    ``follow`` (the loop), then ``close``. ``plan`` and ``record`` are the current
    attempt's; ``cluster`` holds its hosts (a new one once a spare took a rank)."""

    def __init__(self, cluster: HostGroup, request: RunRequest,
                 validated: Optional[Validated] = None, notify: Notify = _quiet):
        self.original = cluster          # the caller's: never closed here
        self.cluster = cluster
        self.request = request
        self.validated = validated or validate(cluster.hosts, request)
        self.notify = notify
        self.spares = SpareState(spare_pool(cluster.hosts, request.spares))
        self.plan: Any = None
        self.record: Any = None
        self.code_shared = False   # the code directory is every host's own: no copy

    def __enter__(self) -> "Lifecycle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ---------------------------------------------------------------------
    def prepare(self, *, sync_view=None, checked=None):
        """Attempt 0 up to its launch: check (the spares checked beside the hosts), sync,
        setup, plan; returns (plan, record). ``sync_view`` listens to the sync; ``checked``
        is the report of a preflight these hosts already passed (``scale`` checks all its
        hosts once, then runs its points on some of them)."""
        job = self.validated.job
        if self.request.sync and checked is None:
            # The same connections with other workdirs: still the caller's to close.
            self.cluster, self.code_shared = in_place_if_shared(self.cluster, job, self.notify)
            self.original = self.cluster
        revision = revision_in_background(job.code)
        report = checked
        if self.request.check and checked is None:
            bad = checked_in_background(self.cluster, self.spares.pool, job, self.notify)
            report = self.check(0, self.cluster.hosts, known_bad=bad)
            self.spares = self.spares.drop(bad())
        start_port = report.start_port if report else job.start_port
        if start_port is None:
            raise ConfigError("--start-port auto needs the preflight to find a free port",
                              fix="drop --no-check, or give a port: --start-port 17000")
        sync_for_run(self.cluster, job, code=self.request.sync and not self.code_shared,
                     data_checked=report is not None,
                     notify=self.notify, view=sync_view)
        digest = setup(self.cluster, job, self.request.setup,
                       always=self.request.setup_always, notify=self.notify)
        image_id = self.image_everywhere(self.cluster)
        self.plan = plan_for(self.cluster, self.request, self.validated, report, new_run_id(),
                             start_port)
        if image_id:
            self.plan = dataclasses.replace(
                self.plan, container=dict(self.plan.container, image_id=image_id))
        record = initial_record(self.plan, self.request, self.cluster, revision())
        self.record = dataclasses.replace(record, code_digest=digest, **self._spare_fields())
        return self.plan, self.record

    def image_everywhere(self, cluster) -> Optional[str]:
        """--image: on every host, one id everywhere (image_step.py); that id."""
        if not self.request.image:
            return None
        from .image_step import ensure_image

        return ensure_image(cluster, self.request.image, self.request.engine,
                            from_controller=self.request.image_from_controller,
                            notify=self.notify)

    def follow(self, listener_for: Callable[[], Any],
               holder: Optional[Dict[str, object]] = None) -> Outcome:
        """Execute the prepared attempt; while the policy allows, replace, check, sync,
        set up, plan and execute again. Returns the last attempt's Outcome (``plan`` is
        its plan). ``listener_for()`` gives each attempt its listener; ``holder`` gets the
        attempt's Controls (the dashboard's keys, the API's ``stop``). Raises RunFailed,
        naming the failed attempt and what stops the next, when a restart cannot start."""
        limit = restart_budget(self.request.max_restarts, len(self.record.spares))
        if not limit or self.request.detach:
            return self.execute(listener_for(), holder)
        run_log_dir = self.record.log_dir
        self.record = dataclasses.replace(self.record, max_restarts=limit,
                                          log_dir=attempt_log_dir(run_log_dir, 0, limit))

        def restarting(result, ended) -> str:   # said by the views as the attempt ends
            if not self.restarts(result, ended, limit):
                return ""
            return attempt_label(self.plan.attempt + 1, limit)

        while True:
            outcome = self.execute(listener_for(), holder, restarting)
            ended = load_run(self.plan.run_id)   # the attempt's record, as it ended
            if not self.decide(outcome, ended, limit):
                return outcome
            self.restart(outcome, ended, attempt_log_dir(run_log_dir, self.plan.attempt + 1,
                                                         limit))

    def close(self) -> None:
        if self.cluster is not self.original:
            self.cluster.close()

    # -- the steps --------------------------------------------------------------------
    def check(self, attempt: int, before: Sequence[Host],
              known_bad: Callable[[], Sequence[str]] = lambda: ()):
        """The preflight (unless ``--no-check``: then None); while it fails on a host and
        a spare is left, that host's node rank goes to the spare and it runs again (a
        spare that fails in turn gives its place to the next). ``known_bad`` names the
        spares whose own check failed (asked at the first replacement). Raises the last
        failure when no spare is left."""
        job = self.validated.job
        report = None
        while self.request.check and report is None:
            try:
                report = preflight(self.cluster, job, allow_concurrent=self.request.allow_concurrent,
                                   notify=self.notify)
            except CheckError as err:
                if not self.spares.replacements:
                    self.spares = self.spares.drop(known_bad())
                node = next((h.rank for h in self.cluster.hosts if h.label == err.host), None)
                if node is None or not self.spares.pool:
                    if self.spares.replacements and not self.spares.pool:
                        raise CheckError(f"{err.cause}; no spare is left", host=err.host,
                                         fix=err.fix) from None
                    raise
                hosts, self.spares = self.spares.replace(self.cluster.hosts, node, attempt, "check")
                self.notify(f"{err.host} failed the check ({err.cause}): "
                            f"{self.spares.replacements[-1].line}")
                self._move_to(hosts)
        same_shape(job, before, self.cluster.hosts)
        return report

    def execute(self, listener, holder: Optional[Dict[str, object]] = None,
                restarting: Callable[[Any, Any], str] = lambda result, record: "") -> Outcome:
        """Launch in ip order and follow to the end (with ``--detach``: until every node
        runs). A listener with ``close`` (the dashboard) is closed at the attempt's end,
        giving the terminal back before anything else is printed. ``restarting`` names
        the attempt that will follow this one's end ('' for none), for the views."""
        holder = {} if holder is None else holder
        options = RunOptions(detach=self.request.detach, wait_after_exit=self.request.wait,
                             hang_timeout=self.request.hang_timeout, restarting=restarting)
        try:
            outcome = start_and_follow(self.cluster, self.plan, self.record, listener, options,
                                       holder)
        finally:
            getattr(listener, "close", lambda: None)()
        controls: Any = holder["controls"]
        return dataclasses.replace(outcome, stop_reason=controls.interrupts.reason or "")

    def decide(self, outcome: Outcome, ended, limit: int) -> bool:
        """Whether another attempt follows the one that just ended."""
        return self.restarts(outcome.result, ended, limit)

    def restarts(self, result, ended, limit: int) -> bool:
        """Whether an attempt that ended with ``result`` (its record: ``ended``) is
        followed by another: asked as it ends, so the views can say so."""
        lost = bool(result.lost) if result is not None else False
        return (self.plan.attempt < limit and restartable(result)
                and may_restart(self.request.max_restarts, self.plan.attempt, lost,
                                len(ended.spares)))

    def restart(self, outcome: Outcome, ended, log_dir: str) -> None:
        """The next attempt up to its launch: a lost host's rank to a spare, check, the
        spares that took a rank synced and set up, plan, record. Raises RunFailed when
        it cannot start (a lost host still gone, no spare left): the run then ends with
        the failed attempt's status, and the error names what stops the next."""
        result, plan = outcome.result, self.plan
        limit = ended.max_restarts
        attempt = plan.attempt + 1
        label = attempt_label(plan.attempt, limit)
        lost = "".join(f"; {plan.nodes[r].host.label} was lost" for r in result.lost)
        if lost:   # the attempt's failure and the restart were said as it ended (views)
            self.notify(lost[2:])
        self.spares = SpareState(tuple(host_from_dict(h) for h in ended.spares),
                                 tuple(Replacement.from_json(r) for r in ended.replacements))
        try:
            self.replace_lost(result.lost, attempt)
            report = self.check(attempt, [n.host for n in plan.nodes])
            taken = {r.node_rank for r in self.spares.replacements if r.attempt == attempt}
            self.ready_spares([h for h in self.cluster.hosts if h.rank in taken])
            start_port = report.start_port if report and report.start_port else plan.start_port
            self.plan = dataclasses.replace(
                plan_for(self.cluster, self.request, self.validated, report, plan.run_id,
                         start_port), attempt=attempt, container=plan.container)
        except MultihostError as err:
            raise RunFailed(f"run {plan.run_id} failed ({label}: {describe(result.root_cause)}"
                            f"{lost}); it cannot restart: {err.cause}", host=err.host,
                            fix=err.fix, exit_code=result.exit_code) from None
        self.record = dataclasses.replace(
            next_attempt(ended, log_dir, start_port, nodes=node_records(self.plan)),
            **self._spare_fields())

    def replace_lost(self, lost: Sequence[int], attempt: int) -> None:
        """Each lost host's node rank to the next spare (one left in place when none is:
        the check then fails on it, and the error says so)."""
        hosts = self.cluster.hosts
        for node in lost:
            swapped = self.spares.replace(hosts, node, attempt, "lost")
            if swapped is not None:
                hosts, self.spares = swapped
                self.notify(self.spares.replacements[-1].line)
        self._move_to(hosts)

    def ready_spares(self, hosts: Sequence[Host]) -> None:
        """The code synced (and the data verified, and the setup run) on the spares that
        just took a rank, before the next attempt starts; the other hosts keep theirs."""
        if not hosts:
            return
        job = self.validated.job
        with HostGroup(hosts, self.cluster.options, workers=self.cluster.workers) as own:
            sync_for_run(own, job, code=self.request.sync, data_checked=False,
                         notify=self.notify)
            setup(own, job, self.request.setup, always=self.request.setup_always,
                  notify=self.notify)
            self.image_everywhere(own)   # the launch checks its id is the run's

    # -- helpers ----------------------------------------------------------------------
    def _move_to(self, hosts: Sequence[Host]) -> None:
        """The attempt's hosts become ``hosts``: a HostGroup is keyed by node rank, so a
        host list with a spare in it gets one of its own (same ssh options); the one left
        is closed unless it is the caller's."""
        if tuple(hosts) == tuple(self.cluster.hosts):
            return
        left = self.cluster
        self.cluster = HostGroup(hosts, left.options, workers=left.workers)
        if left is not self.original:
            left.close()

    def _spare_fields(self) -> Dict[str, tuple]:
        return {"spares": tuple(host_to_dict(h) for h in self.spares.pool),
                "replacements": tuple(r.to_json() for r in self.spares.replacements)}


def same_shape(job: JobOptions, before: Sequence[Host], after: Sequence[Host]) -> None:
    """A spare runs the processes of the node it replaces, or the world would change
    size and every rank after it would move."""
    for old, new in zip(before, after):
        if job.nproc_for(old) != job.nproc_for(new):
            raise ConfigError(f"spare {new.label} would run {job.nproc_for(new)} process(es) "
                              f"where node {old.rank} ran {job.nproc_for(old)}",
                              host=new.label,
                              fix="give the spare the same gpus/slots as the hosts, or none "
                                  "(it then takes those of the node it replaces)")
