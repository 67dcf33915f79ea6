"""Following a started run until it ends everywhere, and ending it everywhere.

One thread per host follows a ``run.watch`` stream (status_streams.py): a status line on
every change and at least every second, so a silent stream means a dead link (it is
reopened, and a host with no answer for MULTIHOST_LOST_AFTER seconds, 15 by default, is
lost: waits.py). The main loop turns the answers into NodeChanged events and decides:

- the first rank that exits non-zero (or a node that fails, or a host unreachable for
  those seconds) ends the run on every host: ``run.stop`` with the grace period
  (--kill-wait), after which the hosts' supervisors SIGKILL what is left;
- Ctrl-C does the same; a second Ctrl-C stops with no grace;
- --wait S ends the run S seconds after the first rank exited (srun -W);
- when every node has finished (or is lost), the root cause is the earliest failure by
  time (outcome.root_cause), with the last lines of its log;
- under Slurm, a node whose stream breaks or whose kept launch step ends makes the
  monitor ask Slurm whether the job has ended (slurm/ending.py, on a thread): if it has,
  Slurm ended every rank, so the run ends at once with that as its cause (no wait for
  lost hosts, no stop sent to nodes that are gone).

The decisions themselves are pure (outcome.py); this module only does the talking.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

from .. import helper, waits
from ..errors import CommandTimeout, ConnectError, MultihostError
from ..events import Listener, NodeChanged, NodeState, Notice, RunFinished, RunState, RunStopping
from .outcome import (AttemptEnd, Failure, NodeView, conclude, detached_end, failures_of,
                      parse_status, refine, root_cause)
from .peers import peer_first
from .plan import RunPlan
from .restarts import attempt_label
from .slurm_job import SlurmJobWatch
from .interrupts import Interrupts
from .start import RecordKeeper
from .status_streams import StatusStreams

POLL_INTERVAL = 0.2     # how often a host looks at its node's records
STATUS_TIMEOUT = 5.0
# A failure this close before the contact loss that found the job ended is Slurm's doing
# (it signals every task at once; a rank's death may be heard first).
SLURM_SLACK = 2.0
TAIL_LINES = 20
_STATES = {s.value: s for s in NodeState}


class Monitor:
    def __init__(self, cluster, plan: RunPlan, listener: Listener, keeper: RecordKeeper,
                 interrupts: Interrupts, *, poll_interval: float = POLL_INTERVAL,
                 lost_after: Optional[float] = None, wait_after_exit: Optional[float] = None,
                 settle: Callable[[bool], None] = lambda lost: None,
                 hung: Callable[[float], Optional[Failure]] = lambda now: None,
                 tick: Callable[[float], None] = lambda now: None,
                 restarting: Callable[[AttemptEnd, object], str] = lambda end, record: "",
                 steps: Optional[Dict[int, object]] = None):
        self.cluster = cluster
        self.plan = plan
        self.listener = listener
        self.keeper = keeper
        self.interrupts = interrupts
        self.poll_interval = poll_interval
        self.lost_after = waits.lost_after() if lost_after is None else lost_after
        self.wait_after_exit = wait_after_exit
        self.settle = settle
        self.hung = hung      # --hang-timeout (hangs.py): a Failure when the run is hung
        self.tick = tick      # every turn of the loop: stragglers are judged (progress.py)
        # The label of the attempt that will follow this one's end ('' for none): the
        # views then say the attempt failed, not the run (lifecycle.py decides).
        self.restarting = restarting
        self.hosts = [node.host for node in plan.nodes]
        self.queue: "queue.Queue[tuple]" = queue.Queue()
        self.stop_polling = threading.Event()
        self.views: Dict[int, NodeView] = {}
        self.states: Dict[int, str] = {h.rank: "running" for h in self.hosts}
        self.last_contact: Dict[int, float] = {}
        self.last_error: Dict[int, MultihostError] = {}
        self.lost: Set[int] = set()
        self.out_of_contact: Set[int] = set()   # stream broken, not yet lost: retrying
        self.failures: Dict[tuple, Failure] = {}
        self.seen_before_teardown: Set[tuple] = set()
        self.first_exit_seen: Optional[float] = None
        self.teardown_at: Optional[float] = None
        self.trigger: Optional[Failure] = None
        self.handled_interrupts = 0
        self.status_streams = StatusStreams(cluster, plan.run_id, poll_interval,
                                            self.queue, self.stop_polling)
        self.servers_stopped = False
        # Under Slurm: the job the nodes are steps of, and its end once Slurm said it.
        self.slurm = SlurmJobWatch.of(cluster, steps, self.queue, self.stop_polling)
        self.slurm_cause: Optional[Failure] = None
        self.ended_by_slurm: Set[int] = set()
        self.unsaid: Dict[int, Tuple[MultihostError, float]] = {}   # contact losses held

    # --- asking hosts to stop ---------------------------------------------------------
    def _stop_all(self, grace: float, reason: str, interrupted: bool = False) -> None:
        """Ask every host still running to stop, and say so at once: the rows show
        "stopping" for the grace period, not the old state."""
        asked = [h for h in self.hosts if not self._finished(h.rank) and h.rank not in self.lost]
        for host in asked:
            self.status_streams.stop(host, grace, reason)
        for rank in self.lost:   # one that answers again while the others stop is stopped too
            self.status_streams.stop_when_back(self.hosts[rank], grace, reason)
        now = time.time()
        if asked or interrupted:   # every host ended already: no stop to tell of
            self.listener(RunStopping(reason, len(asked), grace, interrupted, now))
        for host in asked:
            self.listener(NodeChanged(host.rank, host.label, NodeState.STOPPING, time=now))

    # --- bookkeeping ------------------------------------------------------------------
    def _finished(self, rank: int) -> bool:
        view = self.views.get(rank)
        return view is not None and view.finished

    def _set_state(self, rank: int, state: str, detail: str = "",
                   view: Optional[NodeView] = None) -> None:
        if self.states.get(rank) == state:
            return
        self.states[rank] = state
        host = self.hosts[rank]
        code = view.exit_code if view is not None else None
        self.keeper.node(rank, state=state, detail=detail,
                         exit_code=code, signal=view.signal if view else None,
                         ended=view.ended if view else None)
        self.listener(NodeChanged(rank, host.label, _STATES.get(state, NodeState.FAILED),
                                  exit_code=code, detail=detail, time=time.time()))

    def _add_failure(self, failure: Failure) -> None:
        key = (failure.node_rank, failure.kind, failure.local_rank)
        if key in self.failures:
            return
        self.failures[key] = failure
        if self.teardown_at is None:
            self.seen_before_teardown.add(key)

    def _take(self, item: tuple) -> None:
        kind, rank, payload, when = item
        if kind == "slurm":
            self._slurm_answered(rank, payload, when)
            return
        if kind == "step":      # a node's kept launch step ended: has the job ended?
            if not self._finished(rank) and rank not in self.ended_by_slurm \
                    and self.slurm_cause is None:
                self.slurm.ask(rank, when)
            return
        if kind == "contact":   # a stream reached the host again: it answers
            self.last_contact[rank] = when
            return
        if kind == "error":
            self.last_error[rank] = payload
            if rank not in self.ended_by_slurm and not self._finished(rank) \
                    and self.slurm_cause is None:
                self.slurm.ask(rank, when)
            if self.slurm.asking:   # said once Slurm answers that the job runs on
                self.unsaid[rank] = (payload, when)
            else:
                self._contact_lost(rank, payload, when)
            return
        view: NodeView = payload
        self._say_stop_notes(rank, self.views.get(rank), view, when)
        self.views[rank] = view
        self.last_contact[rank] = when
        if rank in self.out_of_contact:
            self.out_of_contact.discard(rank)
            if rank not in self.lost:
                self.listener(NodeChanged(rank, self.hosts[rank].label, NodeState.RUNNING,
                                          detail="contact restored", time=when))
        if rank in self.lost and not view.finished:
            return  # back, but its fate was decided: it is stopped with the others
        host = self.hosts[rank]
        if view.state != "stopped":  # a stopped node's ranks died of the stop
            for failure in failures_of(rank, host.label, view, when):
                self._add_failure(failure)
        if self.first_exit_seen is None and (view.finished or any(r.ended for r in view.ranks)):
            self.first_exit_seen = when
        if view.finished or view.state == "failed":
            self._set_state(rank, view.state, view.detail, view)

    def _say_stop_notes(self, rank: int, before: Optional[NodeView], view: NodeView,
                        when: float) -> None:
        """A host's stop that waits says what for; one that killed early says why."""
        for field in ("stop_wait", "stop_note"):
            text = getattr(view, field)
            if text and text != (getattr(before, field) if before is not None else ""):
                self.listener(Notice(rank, self.hosts[rank].label, text, when))

    def _contact_lost(self, rank: int, error: MultihostError, when: float) -> None:
        """Say once that a host stopped answering, long before it counts as lost: the
        user sees why its lines paused, and that the controller keeps trying."""
        if rank in self.out_of_contact or rank in self.lost or self._finished(rank) \
                or rank in self.ended_by_slurm \
                or self.teardown_at is not None \
                or not isinstance(error, (ConnectError, CommandTimeout)):
            return
        self.out_of_contact.add(rank)
        self.listener(NodeChanged(rank, self.hosts[rank].label, NodeState.RUNNING,
                                  detail=f"contact lost ({error.cause}); retrying, the host "
                                         f"counts as lost after {self.lost_after:g}s",
                                  time=when))

    # --- Slurm ending the job under the run -------------------------------------------
    def _slurm_answered(self, rank: int, end, when: float) -> None:
        """The job ended (``end``, a slurm.ending.JobEnd): every node still running was
        ended by Slurm. Its end is the root cause unless a failure came well before."""
        self.slurm.answered()
        unsaid, self.unsaid = self.unsaid, {}
        if end is None or self.slurm_cause is not None:
            # The job runs on (or Slurm did not answer): the host may yet be lost.
            for lost_rank, (error, lost_at) in sorted(unsaid.items()):
                self._contact_lost(lost_rank, error, lost_at)
            return
        host = self.hosts[rank]
        cause = Failure(when, rank, host.label, "slurm", detail=end.line(),
                        fix=end.fix(len(self.hosts), self.plan.run_id))
        self.slurm_cause = cause
        if self.trigger is None or self.trigger.time >= when - SLURM_SLACK:
            self.trigger = cause
        self._add_failure(cause)
        if self.teardown_at is None:
            self.teardown_at = time.time()   # nothing to stop: Slurm ended every rank
        for other in self.hosts:
            if not self._finished(other.rank) and other.rank not in self.lost:
                self.ended_by_slurm.add(other.rank)
                self.out_of_contact.discard(other.rank)
                self._set_state(other.rank, "stopped", f"ended by Slurm (job {end.job_id} "
                                                       f"{end.cause})")

    def _check_lost(self, now: float) -> None:
        for host in self.hosts:
            rank = host.rank
            if rank in self.lost or self._finished(rank) or rank in self.ended_by_slurm:
                continue
            if now - self.last_contact.get(rank, now) >= self.lost_after:
                self.lost.add(rank)
                error = self.last_error.get(rank)
                why = error.cause if error else "no answer"
                detail = f"no answer for {self.lost_after:g}s ({why})"
                self._add_failure(Failure(self.last_contact[rank], rank, host.label, "lost",
                                          detail=f"host lost: {detail}"))
                self._set_state(rank, "lost", detail)

    def _teardown(self, grace: float, reason: str, interrupted: bool = False) -> None:
        self.teardown_at = time.time()
        self._stop_all(grace, reason, interrupted)

    def _decide(self, now: float) -> None:
        self.tick(now)
        if self.interrupts.count > self.handled_interrupts:
            if self.handled_interrupts == 0 and self.teardown_at is None:
                self._teardown(self.plan.kill_wait,
                               self.interrupts.reason or "interrupted (Ctrl-C on the controller)",
                               interrupted=True)
            else:
                self._stop_all(0, "interrupted twice: no grace", interrupted=True)
            self.handled_interrupts = self.interrupts.count
        self._check_lost(now)
        if self.teardown_at is not None:
            return
        if self.plan.ps is not None and not self.servers_stopped and self._trainers_done():
            # Parameter servers never stop by themselves: once every trainer on every
            # host is done, the job is done (the nodes then count as succeeded).
            self.servers_stopped = True
            self._stop_all(self.plan.kill_wait, "every trainer finished: stopping the servers")
        self.trigger = root_cause(list(self.failures.values()))
        if self.trigger is not None:
            self._teardown(self.plan.kill_wait, f"teardown: {self.trigger.host} "
                                                f"(node {self.trigger.node_rank}) failed")
        elif self.wait_after_exit is not None and self.first_exit_seen is not None \
                and now - self.first_exit_seen >= self.wait_after_exit:
            running = [h for h in self.hosts if not self._finished(h.rank)]
            if running:
                self.trigger = Failure(now, running[0].rank, running[0].label, "wait",
                                       detail=f"still running {self.wait_after_exit:g}s after "
                                              "the first rank ended (--wait)")
                self._add_failure(self.trigger)
                self._teardown(self.plan.kill_wait, "--wait expired")
        if self.trigger is None:
            hang = self.hung(now)
            if hang is not None:
                self.trigger = hang
                self._add_failure(hang)
                self._teardown(self.plan.kill_wait, "hung (--hang-timeout)")

    def _trainers_done(self) -> bool:
        views = [self.views.get(h.rank) for h in self.hosts]
        return all(v is not None and (v.serving or v.state == "succeeded") for v in views)

    def _done(self) -> bool:
        return all(h.rank in self.lost or h.rank in self.ended_by_slurm or self._finished(h.rank)
                   for h in self.hosts)

    # --- the loop ---------------------------------------------------------------------
    def watch_all(self) -> None:
        """Start following every host's status (once). Called before the log streams
        open: a failure must not wait behind 64 hosts' logs to be seen."""
        if self.last_contact:
            return
        now = time.time()
        for host in self.hosts:
            self.last_contact[host.rank] = now
            self.status_streams.open(host)
        self.slurm.watch_steps()

    def watch_to_end(self) -> AttemptEnd:
        """Watch every host until the attempt ended everywhere (or is detached): its end."""
        self.watch_all()
        self.keeper.update(state=RunState.RUNNING)
        try:
            while not self._done() and not self.interrupts.detached:
                try:
                    self._take(self.queue.get(timeout=0.1))
                    while True:
                        self._take(self.queue.get_nowait())
                except queue.Empty:
                    pass
                self._decide(time.time())
        finally:
            self.stop_polling.set()
            self.status_streams.close_all()
        if not self._done():  # detached: the record says running, the hosts go on
            return detached_end(self.states[h.rank] for h in self.hosts)
        return self._finish()

    def _candidates(self) -> List[Failure]:
        """Failures that explain the end: those seen before the teardown, and any found
        later that happened before the one that triggered it (polls lag)."""
        found = [f for key, f in self.failures.items() if key in self.seen_before_teardown]
        if self.trigger is not None:
            found += [f for key, f in self.failures.items()
                      if key not in self.seen_before_teardown and f.time <= self.trigger.time]
        return found

    def _status_with_tail(self, node_rank: int, local_rank: Optional[int]) -> Optional[NodeView]:
        request = {"run_id": self.plan.run_id, "tail": TAIL_LINES}
        if local_rank is not None:
            request["tail_rank"] = local_rank
        try:
            transport = self.cluster.transport(self.hosts[node_rank])
            return parse_status(helper.call(transport, "run.status", request,
                                            timeout=STATUS_TIMEOUT))
        except MultihostError:
            return None

    def _explain(self, failure: Failure) -> Tuple[Failure, Tuple[str, ...]]:
        """The root cause made precise (the rank a launcher named) and its last lines."""
        if failure.kind in ("lost", "wait", "hang", "slurm"):
            return failure, ()
        view = self._status_with_tail(failure.node_rank, failure.local_rank)
        if view is None:
            return failure, ()
        if failure.kind == "node":
            offset = self.plan.nodes[failure.node_rank].rank_offset
            refined = refine(failure, view.launcher_tail, offset)
            if refined.local_rank is not None:
                again = self._status_with_tail(failure.node_rank, refined.local_rank)
                if again is not None and again.tails.get(refined.local_rank):
                    return refined, again.tails[refined.local_rank]
            return refined, view.launcher_tail
        if failure.local_rank is not None and view.tails.get(failure.local_rank):
            return failure, view.tails[failure.local_rank]
        return failure, view.launcher_tail

    def _finish(self) -> AttemptEnd:
        slurm = self.slurm_cause is not None and self.trigger is self.slurm_cause
        cause = self.slurm_cause if slurm else root_cause(self._candidates())
        tail: Tuple[str, ...] = ()
        if cause is not None:
            explained: Dict[tuple, Tuple[Failure, Tuple[str, ...]]] = {}

            def explain(failure: Failure) -> Tuple[Failure, Tuple[str, ...]]:
                key = (failure.node_rank, failure.kind, failure.local_rank, failure.server)
                if key not in explained:
                    explained[key] = self._explain(failure)
                return explained[key]
            cause, tail = explain(cause)
            # Every failure a host recorded, also those heard after the teardown began: a
            # loaded host's status comes late, and the rank that crashed there with it.
            peer = peer_first(cause, tail, list(self.failures.values()), explain)
            if peer is not None:   # it died of that peer's death (peers.py)
                cause, tail = explain(peer)
            if tail and not cause.tail:  # the fix can then read what it printed last
                cause = dataclasses.replace(cause, tail=tuple(tail))
        # A stop asked for on purpose (the dashboard's [s]) ends like `multihost stop`.
        interrupted = self.interrupts.count > 0 and self.interrupts.reason is None
        states = tuple(self.states[h.rank] for h in self.hosts)
        nodes = [(r, self.hosts[r].label, view) for r, view in sorted(self.views.items())]
        end = dataclasses.replace(conclude(states, cause, interrupted, tail, nodes),
                                  states=states, lost=tuple(sorted(self.lost)))
        self.settle(bool(self.lost) or self.slurm_cause is not None)
        record = self.keeper.update(state=end.state, exit_code=end.exit_code,
                                    ended=time.time(), root_cause=end.root_cause)
        self.listener(RunFinished(self.plan.run_id, end.exit_code, end.root_cause, time.time(),
                                  logs=record.log_dir,
                                  attempt=attempt_label(self.plan.attempt, record.max_restarts),
                                  restarting=self.restarting(end, record)))
        return end
