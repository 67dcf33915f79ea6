"""Starting a run on every host: prepare all, then launch in ip order.

1. ``run.prepare`` on every host at once: take the host lock, create the run directory,
   learn the absolute paths and the interfaces. A busy or broken host stops the run
   here, before anything starts anywhere (the hosts already prepared are released).
2. ``run.launch`` on node 0 (the rendezvous host) first, then on the others at once.
   Each call returns when that node's launcher runs. Its helper was started beside the
   prepare and waits for the request (``helper.HeldCall``): a launch costs no helper
   start, and node 0's is one message there and back. A host that fails to start stops
   the run everywhere (``rollback``) and names the host, the cause and the fix.
3. Once all run, the word each node waits for: on a followed run, the first line of
   the status stream the monitor opens to each host carries it (status_streams.py; no
   round trip of its own); a detached run, or one under Slurm (where a step that ends
   now is Slurm's to explain), sends it with ``run.launched`` here. A node without it
   by its launch deadline (prepare + ``--launch-timeout``) stops its ranks itself, and
   a node never launched counts as stopped: a controller lost half way through leaves
   no rank waiting for peers that will never come.

The run's record (records.py) is written before the first launch, so ``status`` and
``stop`` can find the run even if this controller dies a moment later. It becomes the
"last" run only once every host is prepared: a run refused there (a busy host) never
started, and a bare ``status`` must go on meaning the run that did.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .. import helper
from ..errors import EXIT_INTERRUPTED, ConnectError, LaunchError, MultihostError, RunFailed
from ..events import Listener, NodeChanged, NodeState, RootCause, RunState
from ..fanout import HostResult
from ..hosts import PROJECT, Host
from ..slurm.steps import keeps_steps, launch_kept
from .plan import Prepared, RunPlan, launch_request
from ..registry.entry import hold_request
from .records import RunRecord, save_run

PREPARE_TIMEOUT = 30.0
LAUNCH_TIMEOUT = 60.0
CONFIRM_TIMEOUT = 30.0
DEFAULT_LAUNCH_TIMEOUT = 120.0


class RecordKeeper:
    """The run's record, updated from several threads and saved on every change."""

    def __init__(self, record: RunRecord, make_last: bool = True):
        self._lock = threading.Lock()
        self.record = record
        save_run(record, make_last=make_last)

    def make_last(self) -> None:
        """Name this run in ``~/.multihost/last``: what a bare status, logs or stop mean."""
        with self._lock:
            save_run(self.record, make_last=True)

    def update(self, **changes: Any) -> RunRecord:
        with self._lock:
            self.record = dataclasses.replace(self.record, **changes)
            save_run(self.record)
            return self.record

    def node(self, node_rank: int, **changes: Any) -> RunRecord:
        with self._lock:
            self.record = self.record.with_node(node_rank, **changes)
            save_run(self.record)
            return self.record


def as_launch_error(error: MultihostError) -> MultihostError:
    """A host's failure to start, as the one error the user sees (ssh failures keep
    their own class and exit status)."""
    if isinstance(error, (ConnectError, LaunchError)):
        return error
    return LaunchError(error.cause, host=error.host, fix=error.fix)


def first_error(failed: Sequence[HostResult]) -> MultihostError:
    error = as_launch_error(failed[0].error)
    if len(failed) > 1:
        others = ", ".join(r.host.label for r in failed[1:4])
        error.cause += f" (and {len(failed) - 1} more: {others})"
    return error


class Starter:
    def __init__(self, cluster, plan: RunPlan, listener: Listener, keeper: RecordKeeper,
                 interrupted: Callable[[], bool] = lambda: False):
        self.cluster = cluster
        self.plan = plan
        self.listener = listener
        self.keeper = keeper
        self.interrupted = interrupted
        self.prepared: Dict[int, Prepared] = {}
        # Each node's launch, its helper started beside the prepare and waiting for its
        # request (helper.HeldCall): a launch then costs no helper start.
        self.held: Dict[int, helper.HeldCall] = {}
        self.steps: Dict[int, Any] = {}   # under Slurm: each node's kept launch step

    @property
    def launch_timeout(self) -> Optional[float]:
        """A node's launch deadline after its prepare; none for one node: its launch is
        the whole launch."""
        if len(self.plan.nodes) < 2:
            return None
        return float(getattr(self.plan, "launch_timeout", None) or DEFAULT_LAUNCH_TIMEOUT)

    def _node_event(self, host: Host, state: NodeState, detail: str = "") -> None:
        self.listener(NodeChanged(host.rank, host.label, state, detail=detail, time=time.time()))

    def prepare(self) -> Dict[int, Prepared]:
        plan = self.plan

        def one(host: Host, transport) -> Prepared:
            node = plan.nodes[host.rank]
            if not keeps_steps(transport):   # its launch's helper starts meanwhile
                self.held[host.rank] = helper.HeldCall(transport, "run.launch",
                                                       {"run_id": plan.run_id})
            reply = helper.call(transport, "run.prepare", {
                "run_id": plan.run_id, "node_rank": host.rank, "cwd": node.workdir,
                "in_place": node.in_place,
                # a project's directory under a hostfile's workdir: made if missing (a
                # run without sync, the first of a project there), as the sync would
                "make_cwd": bool(host.workdir and host.workdir.endswith("/" + PROJECT)),
                "allow_concurrent": plan.allow_concurrent, "attempt": plan.attempt,
                "launch_timeout": self.launch_timeout, "hold": hold_request(plan, node)},
                timeout=PREPARE_TIMEOUT)
            return Prepared.from_reply(reply)

        results = self.cluster.map(one)
        for result in results:
            if result.ok:
                self.prepared[result.host.rank] = result.value
                self.keeper.node(result.host.rank, workdir=result.value.workdir,
                                 state="launching")
                self._node_event(result.host, NodeState.LAUNCHING)
        failed = [r for r in results if not r.ok]
        for result in failed:
            self.keeper.node(result.host.rank, state="failed", detail=str(result.error.cause))
            self._node_event(result.host, NodeState.FAILED, str(result.error))
        if failed or self.interrupted():
            self.rollback("the run did not start: " + ("interrupted" if not failed else
                                                       f"{failed[0].host.label} failed"))
            if failed:
                raise first_error(failed)
            raise KeyboardInterrupt
        return self.prepared

    def _launch_one(self, host: Host, transport) -> Dict[str, Any]:
        node = self.plan.nodes[host.rank]
        request = launch_request(self.plan, node, self.prepared[host.rank])
        payload = json.dumps(request).encode()
        if keeps_steps(transport):   # under Slurm: the node's part is a step for the run's life
            reply, self.steps[host.rank] = launch_kept(transport, self.plan.run_id, payload,
                                                       LAUNCH_TIMEOUT)
        elif host.rank in self.held:
            held = self.held.pop(host.rank)
            held.release(payload, go=True)
            reply = held.reply(timeout=LAUNCH_TIMEOUT)
        else:
            reply = helper.call(transport, "run.launch", {"run_id": self.plan.run_id},
                                input=payload, timeout=LAUNCH_TIMEOUT)
        self.keeper.node(host.rank, state="running", started=reply.get("started"))
        self._node_event(host, NodeState.RUNNING)
        return reply

    def _launch_in_order(self, hosts: Sequence[Host]) -> List[HostResult]:
        """Node 0 first (it hosts the rendezvous), then every other node at once. The
        results of the nodes that launched, node 0's first."""
        try:
            results = self.cluster.map(self._launch_one, hosts[:1])
            if results[0].ok and len(hosts) > 1 and not self.interrupted():
                results += self.cluster.map(self._launch_one, hosts[1:])
            return results
        finally:
            self.cancel_held()   # the nodes not launched: their helpers end, doing nothing

    def cancel_held(self) -> None:
        held, self.held = self.held, {}
        for call in held.values():
            call.cancel()

    def launch(self, confirm: bool = True) -> None:
        """Every node in ip order (``_launch_in_order``); with ``confirm`` (or under
        Slurm), then the word that all launched, by a call."""
        hosts = [node.host for node in self.plan.nodes]
        results = self._launch_in_order(hosts)
        failed = [r for r in results if not r.ok]
        # Once every node runs, a Ctrl-C is the running run's: the nodes still get the
        # word they wait for, and the follower stops them as it does for any Ctrl-C.
        everywhere = not failed and len(results) == len(hosts)
        if everywhere and self.launch_timeout is not None and (confirm or self.steps):
            failed = [r for r in self.cluster.map(self._confirm_one, hosts) if not r.ok]
        # A step that failed because Slurm ended the job is Slurm's doing, not the node's.
        ended = self.slurm_ended() if failed else None
        for result in failed if ended is None else ():
            self.keeper.node(result.host.rank, state="failed", detail=str(result.error.cause))
            self._node_event(result.host, NodeState.FAILED, str(result.error))
        if ended is not None:
            from ..slurm.ending import EXIT_SLURM_ENDED

            host = failed[0].host
            self.rollback("the Slurm job ended", state=RunState.STOPPED,
                          exit_code=EXIT_SLURM_ENDED,
                          root_cause=RootCause(host.label, host.rank, None, EXIT_SLURM_ENDED,
                                               ended.line(), kind="slurm"))
            raise RunFailed(f"run {self.plan.run_id} ended: {ended.line()}",
                            fix=ended.fix(len(self.plan.nodes), self.plan.run_id),
                            exit_code=EXIT_SLURM_ENDED)
        if failed or not everywhere:
            self.rollback("the run did not start everywhere" if failed
                          else "interrupted during the launch")
            if failed:
                raise first_error(failed)
            raise KeyboardInterrupt

    def slurm_ended(self):
        """The end of the Slurm job the nodes are steps of (a slurm.ending.JobEnd), when
        it ended during the launch (scancel, the time limit); else None."""
        job = str(getattr(getattr(self.cluster, "options", None), "job_id", "") or "")
        if not job:
            return None
        from ..slurm.ending import job_end

        return job_end(job)

    def _confirm_one(self, host: Host, transport) -> Any:
        return helper.call(transport, "run.launched", {"run_id": self.plan.run_id},
                           timeout=CONFIRM_TIMEOUT)

    def rollback(self, reason: str, grace: Optional[float] = None,
                 state: Optional[RunState] = None, exit_code: Optional[int] = None,
                 root_cause: Optional[RootCause] = None) -> List[HostResult]:
        """Stop the run on every host that was prepared (and maybe launched)."""
        self.cancel_held()
        hosts = [self.plan.nodes[rank].host for rank in sorted(self.prepared)]
        grace = self.plan.kill_wait if grace is None else grace

        def one(host: Host, transport) -> Any:
            reply = helper.call(transport, "run.stop", {"run_id": self.plan.run_id,
                                                        "grace": grace, "reason": reason},
                                timeout=grace + 30)
            self.keeper.node(host.rank, state="stopped", detail=reason)
            self._node_event(host, NodeState.STOPPED, reason)
            return reply

        results = self.cluster.map(one, hosts) if hosts else []
        final = state or (RunState.STOPPED if self.interrupted() else RunState.FAILED)
        # A Ctrl-C here ends `multihost run` with 130: the record says what the user saw.
        code = EXIT_INTERRUPTED if final == RunState.STOPPED and self.interrupted() else exit_code
        cause = {} if root_cause is None else {"root_cause": root_cause}
        self.keeper.update(state=final, ended=time.time(), exit_code=code, **cause)
        return results
