"""Pure logic of a run's end: exit statuses decoded, failures found in node reports, the
root cause chosen (the earliest failure by time, like torchrun), and the exit status of
``multihost run``. No I/O here; monitor.py feeds it what the hosts answer.

This is the one place that decides how an attempt of a run ended (``conclude``, an
``AttemptEnd``): its final RunState, its exit status and its root cause, whether the
controller that started it saw the end (monitor.py), a later ``status`` or ``stop`` found
it (control.py), or ``logs --follow`` watched it (logs/show.py). The run's own result,
told to an API user, is ``RunResult`` (handle.py): the last attempt's status and cause.
"""
from __future__ import annotations

import dataclasses
import re
import signal as _signal
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import EXIT_CONNECT, EXIT_INTERRUPTED
from ..events import RootCause, RunState
from ..remote.run.states import FAILED, FINAL_STATES, STOPPED, SUCCEEDED
from ..slurm.ending import EXIT_SLURM_ENDED
from ..untrusted import as_dict, as_int, as_list, as_time, clean_lines, clean_text
from .exits import EXIT_STOPPED, decode_exit, exit_status, launcher_failure

MAX_RANKS = 4096   # ranks of one node a status record may describe

@dataclass(frozen=True)
class RankView:
    local_rank: int
    rank: Optional[int]
    pid: Optional[int]
    started: Optional[float]
    ended: Optional[float]
    exit_code: Optional[int]
    signal: Optional[int]
    exiting: Optional[float] = None   # when its script began to exit (before its atexit)

    @property
    def failed(self) -> bool:
        return bool(self.exit_code) or bool(self.signal)

    @property
    def failed_at(self) -> Optional[float]:
        """When it failed, as its peers saw it: a script that exits closes its
        collectives' connections in its atexit handlers, and its peers may fail on them
        before its process is gone."""
        times = [t for t in (self.exiting, self.ended) if t is not None]
        return min(times) if times else None


@dataclass(frozen=True)
class NodeView:
    """One answer of the ``run.status`` operation, parsed."""

    state: str
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    detail: str = ""
    procs: int = 0
    supervisor_alive: bool = False
    ranks: Tuple[RankView, ...] = ()
    tails: Dict[int, Tuple[str, ...]] = field(default_factory=dict)
    launcher_tail: Tuple[str, ...] = ()
    serving: bool = False         # parameter servers only: every trainer here exited 0
    servers: Tuple[RankView, ...] = ()   # parameter servers only: each one's end
    server_failed: Optional[RankView] = None   # the server whose end failed the node
    server_tail: Tuple[str, ...] = ()          # ... and its last lines
    stopping: Optional[float] = None   # when a stop reached it (`stop`, scancel): not ended yet
    stop_wait: str = ""           # what its stop waits for, while it waits (blocked.py)
    stop_note: str = ""           # why its stop did not wait the whole kill wait

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES


def parse_status(reply: Any) -> NodeView:
    """A host's status record as the controller's model: the record is untrusted input
    (a forged one may hold any JSON), so every number is checked to be one and every
    text and tail line is cleaned of terminal escapes here, once, for every view."""
    reply = as_dict(reply)
    node = as_dict(reply.get("node"))
    ranks = tuple(_rank_view(r) for r in as_list(reply.get("ranks"))[:MAX_RANKS]
                  if isinstance(r, dict))
    tails = {}
    for key, lines in list(as_dict(reply.get("tails")).items())[:MAX_RANKS]:
        local = as_int(int(key)) if isinstance(key, str) and key.isdigit() else None
        if local is not None:
            tails[local] = clean_lines(lines)
    procs = as_int(reply.get("procs"))
    servers = tuple(_rank_view(r) for r in as_list(node.get("servers"))[:MAX_RANKS]
                    if isinstance(r, dict))
    server_failed = as_dict(node.get("server_failed"))
    return NodeView(
        state=clean_text(reply.get("state") or node.get("state") or "unknown", 40),
        exit_code=as_int(node.get("exit_code")), signal=as_int(node.get("signal")),
        started=as_time(node.get("started")), ended=as_time(node.get("ended")),
        detail=clean_text(reply.get("detail") or ""), procs=max(procs or 0, 0),
        supervisor_alive=reply.get("supervisor_alive") is True, ranks=ranks, tails=tails,
        launcher_tail=clean_lines(reply.get("launcher_tail")),
        serving=as_time(node.get("serving")) is not None,   # when every trainer here ended 0
        servers=servers, server_failed=_rank_view(server_failed) if server_failed else None,
        server_tail=clean_lines(server_failed.get("tail")),
        stopping=as_time(node.get("stopping")),
        stop_wait=clean_text(node.get("stop_wait") or "", 300),
        stop_note=clean_text(node.get("stop_note") or "", 300))


def _rank_view(record: dict) -> RankView:
    """A rank's record, or a parameter server's (its ``rank`` is the server's index)."""
    return RankView(as_int(record.get("local_rank")) or 0, as_int(record.get("rank")),
                    as_int(record.get("pid")), as_time(record.get("started")),
                    as_time(record.get("ended")),
                    as_int(record.get("exit_code")), as_int(record.get("signal")),
                    as_time(record.get("exiting")))


@dataclass(frozen=True)
class Failure:
    """Something that ended a node badly, with the time it happened (host clock)."""

    time: float
    node_rank: int
    host: str
    kind: str                      # "rank", "server", "node", "lost", "wait", "hang",
                                   # "slurm" (the job ended: slurm/ending.py)
    rank: Optional[int] = None     # a server: None (its index is ``server``)
    local_rank: Optional[int] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    detail: str = ""
    server: Optional[int] = None   # a parameter server's index
    tail: Tuple[str, ...] = ()     # its last lines, when the host sent them with it
    fix: str = ""                  # a cause that knows its fix (Slurm's end of the job)

    @property
    def reason(self) -> str:
        if self.kind == "lost":
            return self.detail or "host lost"
        if self.kind in ("wait", "hang", "slurm"):
            return self.detail
        decoded = decode_exit(self.exit_code, self.signal)
        if self.kind == "server":
            decoded = f"parameter server {self.server} {decoded}"
        return f"{decoded}: {self.detail}" if self.detail else decoded

    @property
    def name(self) -> str:
        """Who failed, for the ranks that stopped after it: ``rank 3``, ``parameter
        server 1``, ``198.18.0.12 (node 1)``."""
        if self.kind == "server":
            return f"parameter server {self.server}"
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"{self.host} (node {self.node_rank})"

    @property
    def status(self) -> int:
        if self.kind == "lost":
            return EXIT_CONNECT
        if self.kind == "slurm":
            return EXIT_SLURM_ENDED
        if self.kind in ("wait", "hang"):
            return 1
        return exit_status(self.exit_code, self.signal)


# Slurm's end of the job comes first: the ranks it ended at that moment died of it.
_KIND_ORDER = {"slurm": -1, "rank": 0, "server": 0, "node": 1, "lost": 2, "wait": 3, "hang": 3}


def failures_of(node_rank: int, host: str, view: NodeView, now: float) -> List[Failure]:
    """A node's failures: each rank that exited badly; a parameter server that ended
    while trainers ran; the node itself when it failed with no failed rank or server to
    show for it (a launcher that died first, a dead supervisor)."""
    found = [Failure(r.failed_at or now, node_rank, host, "rank", r.rank, r.local_rank,
                     r.exit_code, r.signal) for r in view.ranks if r.failed]
    server = view.server_failed
    if server is not None:
        found.append(Failure(server.ended or now, node_rank, host, "server", None,
                             exit_code=server.exit_code, signal=server.signal,
                             server=server.rank, tail=view.server_tail))
    if view.stopping is not None:   # what died once the node was asked to stop died of it
        found = [f for f in found if f.time < view.stopping]
    if view.state == FAILED and not found:
        found.append(Failure(view.ended or now, node_rank, host, "node",
                             exit_code=view.exit_code, signal=view.signal, detail=view.detail))
    return found


def by_time(failure: Failure) -> Tuple[float, int, int, int]:
    """The order of blame: earliest first; at the same time a rank beats its launcher."""
    return (failure.time, _KIND_ORDER.get(failure.kind, 9), failure.node_rank,
            failure.local_rank if failure.local_rank is not None else -1)


def root_cause(failures: Sequence[Failure]) -> Optional[Failure]:
    """The earliest failure by time; at the same time a rank beats its launcher."""
    if not failures:
        return None
    return min(failures, key=by_time)


# What launchers and multihost end ranks with: torchrun ends a failed rank's neighbours
# with SIGTERM, multihost every other node's. A rank ended so died of a failure, not of
# its own (a script that handles the signal may exit 128+N instead).
STOP_SIGNALS = (_signal.SIGTERM, _signal.SIGINT)


def ended_by_a_stop(failure: Failure) -> bool:
    if failure.signal is not None:
        return failure.signal in STOP_SIGNALS
    code = failure.exit_code
    if code is not None and code < 0:   # subprocess's convention
        return -code in STOP_SIGNALS
    return code is not None and code - 128 in STOP_SIGNALS


# How launchers name the rank that failed, in their own output (recorded in the lab):
#   paddle:   "Container rank 1 status failed cmd [...] code 3 log .../workerlog.1"
#   torchrun: "Root Cause (first observed failure):" ... "rank : 3 (local_rank: 1)"
#             ... "exitcode : 3 (pid: 1234)"
def refine(failure: Failure, launcher_tail: Sequence[str], rank_offset: int) -> Failure:
    """A node-level failure made precise with the rank its launcher named, if any."""
    if failure.kind != "node":
        return failure
    found = launcher_failure(launcher_tail)
    if found is None:
        return failure
    local, code = found
    return dataclasses.replace(failure, kind="rank", local_rank=local, rank=rank_offset + local,
                               exit_code=code if code >= 0 else None,
                               signal=-code if code < 0 else None)


def to_event(failure: Failure, tail: Sequence[str] = (),
             after: Sequence[str] = ()) -> RootCause:
    return RootCause(host=failure.host, node_rank=failure.node_rank, rank=failure.rank,
                     exit_code=failure.status, reason=failure.reason,
                     tail=tuple(tail) or failure.tail, local_rank=failure.local_rank,
                     after=tuple(after), kind=failure.kind)


AFTER_LINES = 8   # of the ranks that stopped after the root cause: more are counted


def stopped_after(cause: Failure, nodes: Sequence[Tuple[int, str, NodeView]]) -> Tuple[str, ...]:
    """Every other rank and parameter server that ended badly, named as stopped after
    the root cause (gloo and NCCL abort when a peer dies, a launcher ends its node's
    ranks, multihost ends the rest), one line per host and way of ending: ``h1 (node 0)
    ranks 0, 1: killed by SIGTERM, stopped after rank 3 failed``. ``nodes``: (node
    rank, host, its last status)."""
    if cause.kind in ("wait", "hang", "slurm"):
        return ()   # every rank was stopped by multihost (or Slurm): nothing failed first
    groups: Dict[Tuple[int, str, str, str], List[int]] = {}
    for node_rank, host, view in sorted(nodes, key=lambda n: n[0]):
        stopped = view.state == STOPPED
        ends = [("rank", r) for r in view.ranks] + [("server", s) for s in view.servers]
        for kind, end in ends:
            if not end.failed or _is_cause(cause, node_rank, kind, end):
                continue
            how = decode_exit(end.exit_code, end.signal, stopped)
            groups.setdefault((node_rank, host, kind, how), []).append(
                end.rank if end.rank is not None else end.local_rank)
    lines = []
    for (node_rank, host, kind, how), numbers in groups.items():
        who = ("parameter server" if kind == "server" else "rank") + \
            ("s" if len(numbers) > 1 else "")
        lines.append(f"{host} (node {node_rank}) {who} {', '.join(map(str, sorted(numbers)))}: "
                     f"{how}, stopped after {cause.name} failed")
    if len(lines) > AFTER_LINES:
        rest = list(groups.items())[AFTER_LINES - 1:]
        hosts = len({node_rank for (node_rank, *_), _ in rest})
        count = sum(len(numbers) for _, numbers in rest)
        lines = lines[:AFTER_LINES - 1] + [f"and {count} more on {hosts} more hosts, stopped "
                                           f"after {cause.name} failed"]
    return tuple(lines)


def _is_cause(cause: Failure, node_rank: int, kind: str, end: RankView) -> bool:
    same = cause.server == end.rank if kind == "server" else cause.local_rank == end.local_rank
    return cause.node_rank == node_rank and cause.kind == kind and same


# Failures whose cause is known from what the rank printed last: (what its tail shows,
# the fix). The first that matches names the fix; the rest of the root cause stays as is.
KNOWN_CAUSES: Tuple[Tuple["re.Pattern[str]", str], ...] = (
    # paddle's gloo rendezvous of a process group after the first reads another group's
    # addresses at random, on one machine too (2.6.2 to 3.3.1 seen, docs/migrating.md)
    (re.compile(r"gloo/transport/tcp/pair\.cc:\d+\]?.*connect \[.*\]:\d+: Connection refused"),
     "paddle's gloo set-up of a process group after the first fails at random, on one machine "
     "too (paddle's, not the network): start the run again with --max-restarts 3, or on CPU "
     "keep to init_parallel_env() and paddle.DataParallel (docs/migrating.md)"),
)


def known_fix(tail: Sequence[str]) -> Optional[str]:
    """The fix of a known cause that the failing rank's last lines show, or None."""
    for pattern, fix in KNOWN_CAUSES:
        if any(pattern.search(line) for line in tail):
            return fix
    return None


def describe(failure: Failure) -> str:
    """One line: ``h2 (node 1) rank 3 (local rank 1): exit 3``."""
    where = f"node {failure.node_rank}"
    if failure.rank is not None:
        where += f", rank {failure.rank}"
        if failure.local_rank is not None:
            where += f" (local rank {failure.local_rank})"
    elif failure.local_rank is not None:
        where += f", local rank {failure.local_rank}"
    return f"{where}: {failure.reason}"


def run_status(states: Sequence[str], cause: Optional[Failure], interrupted: bool) -> int:
    """The exit status of ``multihost run``: 0 when every node succeeded; the root
    cause's status; 130 after Ctrl-C; 143 when stopped from another shell."""
    if cause is not None:
        return cause.status
    if interrupted:
        return EXIT_INTERRUPTED
    if states and all(s == SUCCEEDED for s in states):
        return 0
    if any(s == STOPPED for s in states):
        return EXIT_STOPPED
    return 1


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended: what its record and its RunFinished event say, and what the
    lifecycle decides the next step from. The root cause is one failure, in two forms:
    ``cause`` as found (its exit code, signal and detail: what the fix is built from) and
    ``root_cause`` as the record, the views and the API tell it."""

    state: RunState
    exit_code: int
    root_cause: Optional[RootCause] = None
    cause: Optional[Failure] = None
    interrupted: bool = False        # Ctrl-C on the controller (a stop on purpose is not)
    states: Tuple[str, ...] = ()     # every node's last state, in node order
    lost: Tuple[int, ...] = ()       # the node ranks of the hosts lost
    detached: bool = False           # no longer followed: the run goes on on its hosts
    stop_reason: str = ""            # who stopped it, when multihost did (Interrupts.reason)
    # node rank -> its run directory as that host named it: hosts that share a home keep
    # theirs under ~/.multihost/hosts/<host>/, not ~/.multihost/runs/ (a hint must say so)
    run_dirs: Mapping[int, str] = field(default_factory=dict)


def detached_end(states: Sequence[str] = ()) -> AttemptEnd:
    """An attempt left running (``--detach``, the dashboard's [d]): it has no end yet."""
    return AttemptEnd(RunState.RUNNING, 0, states=tuple(states), detached=True)


def final_state(exit_code: int, cause: Optional[Failure]) -> RunState:
    """Succeeded with status 0; failed when a failure explains the end; else stopped
    (Ctrl-C, a stop from another shell, or Slurm ending the job: the root cause says so)."""
    if exit_code == 0:
        return RunState.SUCCEEDED
    return RunState.FAILED if cause is not None and cause.kind != "slurm" else RunState.STOPPED


def conclude(states: Sequence[str], cause: Optional[Failure], interrupted: bool,
             tail: Sequence[str] = (),
             nodes: Sequence[Tuple[int, str, NodeView]] = ()) -> AttemptEnd:
    """The end of a run whose nodes all ended in ``states``, with ``cause`` its root
    cause (``root_cause`` of its failures), ``tail`` that failure's last lines and
    ``nodes`` every node's last status (node rank, host, view): the ranks that ended
    after the root cause are named as such."""
    code = run_status(states, cause, interrupted)
    told = None if cause is None else to_event(cause, tail, stopped_after(cause, nodes))
    return AttemptEnd(final_state(code, cause), code, told, cause, interrupted)


def status_of_node_records(records: Sequence[Optional[Dict[str, Any]]]) -> int:
    """A run's exit status from the last node records its hosts sent (``logs.tail``),
    when their run.status answers are not all there: 0 when every node that answered
    succeeded, the first failed node's exit status, else 1."""
    nodes = [n for n in records if n]
    failed = [n for n in nodes if n.get("state") == FAILED]
    code = 0 if nodes and not failed else (failed[0].get("exit_code") or 1) if failed else 1
    return code if 0 <= code < 256 else 1
