"""The life of one run, from the first check to its end: read this file first.

    life = Lifecycle(cluster, request, validated, notify)
    plan, record = life.attempt(0)            # check, sync, set up, plan: up to the launch
    end = life.run_to_end(listener_for)       # execute; while the policy allows, attempt
    life.close()                              # k + 1 and execute it

Every attempt goes through the same named steps (SkyPilot's backends have this shape:
provision, sync_workdir, setup, execute, teardown; torch elastic's agent has the loop):

    replace  (attempt k > 0) a lost host's node rank to a spare (``spares.py``)
    check    the preflight (``steps.preflight``); a host that fails it gives its node
             rank to the next spare, and the check runs again
    ready    on the attempt's new hosts, the code synced, the datasets verified, the
             ``--setup`` command run where it has not succeeded on this code and the image
             ensured: every host for attempt 0, after that the spares that took a rank
    plan     node 0's address (the rendezvous), the ports, every node's command; the record
    execute  launch in ip order and watch to the end (``execute.launch_and_watch``): the
             first failure stops every host and is named as the root cause
    decide   end, or attempt k + 1 under the same run id (``restarts.py``:
             ``--max-restarts``, spares, the failure's kind; never after success, Ctrl-C, a
             stop from elsewhere or a detach)

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
from ..spares import SpareState, spare_pool
from .execute import RunOptions, launch_and_watch
from .outcome import AttemptEnd, describe
from .request import (RunRequest, Validated, initial_record, node_records, plan_for,
                      revision_in_background, validate)
from .records import host_to_dict, new_run_id
from .restarts import (attempt_label, attempt_log_dir, may_restart, next_attempt,
                       restart_budget, restartable)
from .start import RecordKeeper
from .steps import (checked_in_background, digest_in_background, in_place_if_shared,
                    preflight, setup, sync_for_run)

Notify = Callable[[str], None]


def _quiet(text: str) -> None:
    pass


class Lifecycle:
    """One run on ``cluster``'s hosts: ``attempt(0)`` (up to its launch), then
    ``run_to_end`` (the loop), then ``close``. ``plan`` and ``record`` are the current
    attempt's (the record as last saved: it is never read back from disk); ``cluster``
    holds its hosts (a new one once a spare took a rank)."""

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
        self.limit = 0             # how many attempts may follow the first
        self.run_log_dir = ""      # the run's own mirror; attempt k's is in it

    def __enter__(self) -> "Lifecycle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ---------------------------------------------------------------------
    def run_to_end(self, listener_for: Callable[[], Any],
                   holder: Optional[Dict[str, object]] = None) -> AttemptEnd:
        """Execute the attempt made ready (``attempt(0)``); while the policy allows, make
        the next one ready and execute it. Returns the last attempt's end (``plan`` is
        its plan). ``listener_for()`` gives each attempt its listener; ``holder`` gets the
        attempt's Controls (the dashboard's keys, the API's ``stop``). Raises RunFailed,
        naming the failed attempt and what stops the next, when a restart cannot start."""
        while True:
            end = self.execute(listener_for(), holder, self.restarting)
            if not self.restarts(end, self.record):
                return end
            self.next_attempt(end)

    def close(self) -> None:
        if self.cluster is not self.original:
            self.cluster.close()

    # -- the steps --------------------------------------------------------------------
    def attempt(self, k: int, *, lost: Sequence[int] = (), sync_view=None, checked=None):
        """Attempt ``k`` up to its launch; returns (plan, record). Its new hosts are
        every host for k = 0, and after that the spares that took a rank at k: a lost
        host's (``lost``: node ranks) or one that failed the check. ``sync_view`` listens
        to the first sync; ``checked`` is the report of a preflight these hosts already
        passed (``scale`` checks all its hosts once, then runs its points on some)."""
        job = self.validated.job
        first = k == 0
        if first and self.request.sync and checked is None:
            # The same connections with other workdirs: still the caller's to close.
            self.cluster, self.code_shared = in_place_if_shared(self.cluster, job, self.notify)
            self.original = self.cluster
        before = self.cluster.hosts if first else [n.host for n in self.plan.nodes]
        revision = revision_in_background(job.code) if first else None
        digest = digest_in_background(job.code) if first else None
        self.replace_lost(lost, k)
        report = checked
        if checked is None:
            bad = checked_in_background(self.cluster, self.spares.pool, job, self.notify) \
                if first and self.request.check else (lambda: ())
            report = self.check(k, before, known_bad=bad)
            self.spares = self.spares.drop(bad())
        start_port = self._start_port(k, report)
        taken = {r.node_rank for r in self.spares.replacements if r.attempt == k}
        digest, image_id = self.ready(
            [h for h in self.cluster.hosts if first or h.rank in taken],
            code=self.request.sync and not (first and self.code_shared),
            data_checked=first and report is not None, view=sync_view,
            digest=digest)
        self.plan = self._plan(k, report, start_port, image_id)
        if first:
            self.record = self._first_record(revision(), digest)
        else:
            self.record = dataclasses.replace(
                next_attempt(self.record, attempt_log_dir(self.run_log_dir, k, self.limit),
                             self.plan.start_port, nodes=node_records(self.plan)),
                **self._spare_fields())
        return self.plan, self.record

    def next_attempt(self, end: AttemptEnd) -> None:
        """The attempt after the one that ended with ``end``, up to its launch. Raises
        RunFailed when it cannot start (a lost host still gone, no spare left): the run
        then ends with the failed attempt's status, and the error names what stops the
        next."""
        plan = self.plan
        label = attempt_label(plan.attempt, self.limit)
        lost = "".join(f"; {plan.nodes[r].host.label} was lost" for r in end.lost)
        if lost:   # the attempt's failure and the restart were said as it ended (views)
            self.notify(lost[2:])
        try:
            self.attempt(plan.attempt + 1, lost=end.lost)
        except MultihostError as err:
            raise RunFailed(f"run {plan.run_id} failed ({label}: {describe(end.cause)}"
                            f"{lost}); it cannot restart: {err.cause}", host=err.host,
                            fix=err.fix, exit_code=end.exit_code) from None

    def image_everywhere(self, cluster) -> Optional[str]:
        """--image: on every host, one id everywhere (image_step.py); that id."""
        if not self.request.image:
            return None
        from .image_step import ensure_image

        return ensure_image(cluster, self.request.image, self.request.engine,
                            from_controller=self.request.image_from_controller,
                            notify=self.notify)

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
                restarting: Callable[[AttemptEnd, Any], str] = lambda end, record: ""
                ) -> AttemptEnd:
        """Launch in ip order and watch to the end (with ``--detach``: until every node
        runs). A listener with ``close`` (the dashboard) is closed at the attempt's end,
        giving the terminal back before anything else is printed. ``restarting`` names
        the attempt that will follow this one's end ('' for none), for the views.
        ``record`` is then the attempt's record as it ended."""
        holder = {} if holder is None else holder
        options = RunOptions(detach=self.request.detach, wait_after_exit=self.request.wait,
                             hang_timeout=self.request.hang_timeout, restarting=restarting)
        keeper = RecordKeeper(self.record, make_last=False)
        try:
            end = launch_and_watch(self.cluster, self.plan, keeper, listener, options, holder)
        finally:
            self.record = keeper.record
            getattr(listener, "close", lambda: None)()
        controls: Any = holder["controls"]
        return dataclasses.replace(end, stop_reason=controls.interrupts.reason or "")

    def restarting(self, end: AttemptEnd, ended) -> str:
        """The label of the attempt that follows the one that ended with ``end``, or ''
        when none does: said by the views as the attempt ends."""
        if not self.restarts(end, ended):
            return ""
        return attempt_label(self.plan.attempt + 1, self.limit)

    def restarts(self, end: AttemptEnd, ended) -> bool:
        """Whether an attempt that ended with ``end`` (its record: ``ended``) is followed
        by another."""
        return (self.plan.attempt < self.limit and restartable(end)
                and may_restart(self.request.max_restarts, self.plan.attempt, bool(end.lost),
                                len(ended.spares)))

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

    def ready(self, hosts: Sequence[Host], *, code: bool, data_checked: bool, view=None,
              digest=None):
        """The code synced (``code``), the data verified, the setup run and the image
        ensured on ``hosts``, the attempt's new ones (the others keep theirs); returns
        (the setup's code digest, the image id), (None, None) when there are none.
        ``digest``: the code's hash being taken in the background (steps.setup)."""
        if not hosts:
            return None, None
        job = self.validated.job
        own = self.cluster if tuple(hosts) == tuple(self.cluster.hosts) else \
            HostGroup(hosts, self.cluster.options, workers=self.cluster.workers)
        try:
            sync_for_run(own, job, code=code, data_checked=data_checked,
                         notify=self.notify, view=view)
            digest = setup(own, job, self.request.setup, always=self.request.setup_always,
                           notify=self.notify, digest=digest)
            return digest, self.image_everywhere(own)   # the launch checks its id is the run's
        finally:
            if own is not self.cluster:
                own.close()

    # -- helpers ----------------------------------------------------------------------
    def _start_port(self, k: int, report) -> int:
        """The ports the check found free; without a check, the job's (then the first
        attempt's)."""
        if k:
            return report.start_port if report and report.start_port else self.plan.start_port
        start_port = report.start_port if report else self.validated.job.start_port
        if start_port is None:
            raise ConfigError("--start-port auto needs the preflight to find a free port",
                              fix="drop --no-check, or give a port: --start-port 17000")
        return start_port

    def _plan(self, k: int, report, start_port: int, image_id: Optional[str]):
        """Attempt k's plan; after the first, with its run id and image."""
        previous = self.plan
        plan = plan_for(self.cluster, self.request, self.validated, report,
                        previous.run_id if k else new_run_id(), start_port)
        if k:
            return dataclasses.replace(plan, attempt=k, container=previous.container)
        if image_id:
            return dataclasses.replace(plan, container=dict(plan.container, image_id=image_id))
        return plan

    def _first_record(self, revision, digest: Optional[str]):
        """Attempt 0's record; with restarts allowed (not for ``--detach``), the budget
        and the attempt's own mirror."""
        record = dataclasses.replace(
            initial_record(self.plan, self.request, self.cluster, revision),
            code_digest=digest, **self._spare_fields())
        self.limit = 0 if self.request.detach else \
            restart_budget(self.request.max_restarts, len(record.spares))
        self.run_log_dir = record.log_dir
        if not self.limit:
            return record
        return dataclasses.replace(record, max_restarts=self.limit,
                                   log_dir=attempt_log_dir(self.run_log_dir, 0, self.limit))

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
