"""Hangs and stalled ranks, seen from the lines the ranks write (``--hang-timeout S``).

A listener in front of the view notes when each rank last wrote a line; where a rank's
lines carry a step (the parser the dashboard uses, read by progress.py), what counts is
when its step last moved, not when it last wrote: a rank printing a heartbeat or a
warning in a loop without stepping is as stuck as a silent one. The monitor asks
``check(now)`` on every turn of its loop:

- a rank inactive (silent, or not stepping) for SILENT_AFTER while another rank went on
  in that time is flagged once (a NodeChanged detail the views show), long before the
  run counts as hung; steps are judged against steps, and when no rank steps, the one
  rank still writing is flagged, not the ranks that wait for it; a launcher is never
  flagged (it is quiet while its ranks work);
- when no rank has been active for S seconds, the run is hung: every rank's stacks are
  captured (stacks.py) into ``stacks-<attempt>.txt`` / ``.json`` in the run's mirror, and
  a Failure of kind "hang" is returned: the monitor stops the run (and --max-restarts
  may restart it). It names the rank that stands apart, where one does: the one whose
  stack differs from every other rank's (the stuck one, while its peers wait in the
  collective), else the one inactive longest; node 0 only when no rank stands apart.

Once some rank prints steps, the lines of a launcher or a parameter server (rank -1)
no longer count as activity: they do not train.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from ..events import Listener, LogBlock, LogLine, LogProgress, NodeChanged, NodeState
from .outcome import Failure

SILENT_AFTER_MAX = 60.0


class HangWatch:
    def __init__(self, listener: Listener, timeout: float, plan, record,
                 cluster, mirror: Optional[Path],
                 steps: Callable[[int], Optional[float]] = lambda rank: None):
        self.listener = listener
        self.timeout = timeout
        self.silent_after = min(SILENT_AFTER_MAX, timeout / 2)
        self.plan = plan
        self.record = record
        self.cluster = cluster
        self.mirror = mirror
        self.steps = steps        # rank -> when its step last moved (None: it prints none)
        self.started = time.time()
        self.last_line: Dict[int, float] = {}
        self.where: Dict[int, tuple] = {}
        self.flagged: Dict[int, float] = {}   # rank: the activity it was flagged at
        self.stacks_file: Optional[Path] = None

    def __call__(self, event: object) -> None:
        if isinstance(event, (LogLine, LogBlock, LogProgress)):   # a bar moving is output
            self.last_line[event.rank] = event.time or time.time()
            self.where[event.rank] = (event.node_rank, event.host)
        self.listener(event)

    def activity(self) -> Dict[int, Tuple[float, bool]]:
        """rank: (when it was last active, whether by a step rather than a line)."""
        stepped = {rank: self.steps(rank) for rank in self.last_line}
        any_steps = any(at is not None for rank, at in stepped.items() if rank >= 0)
        active = {}
        for rank, line_at in self.last_line.items():
            if stepped[rank] is not None:
                active[rank] = (stepped[rank], True)
            elif not (any_steps and rank < 0):
                active[rank] = (line_at, False)
        return active

    def check(self, now: float) -> Optional[Failure]:
        active = self.activity()
        newest = max((when for when, _ in active.values()), default=self.started)
        self._flag_stalled(active, now)
        if now - newest < self.timeout:
            return None
        kinds = {by_step for _, by_step in active.values()}
        what = {frozenset({True}): "made a step",
                frozenset({True, False}): "made a step (or, printing no steps, wrote a line)"
                }.get(frozenset(kinds), "wrote a line")
        said, groups = self._capture_stacks()
        rank, why = apart(groups, {r: when for r, (when, _) in active.items()})
        node_rank, host, local = self._where(rank)
        return Failure(now, node_rank, host, "hang", rank=rank, local_rank=local,
                       detail=f"hung: no rank {what} for {self.timeout:g}s" + why + said)

    def _flag_stalled(self, active: Dict[int, Tuple[float, bool]], now: float) -> None:
        """Flag, once per stall, the rank that stopped while others went on. Once ranks
        print steps, steps are judged against steps: a rank that prints none (rank 0
        prints for all) is quiet by design, and a line is no progress. When no rank
        steps any more, the ranks waiting in a collective are victims, not causes: the
        one rank still writing (looping, retrying) is the one flagged."""
        steps = [when for when, by_step in active.values() if by_step]
        newest = max(steps or [when for when, _ in active.values()], default=self.started)
        for rank, (when, by_step) in active.items():
            if (steps and not by_step) or rank < 0:   # a launcher is quiet while ranks work
                continue
            if self.flagged.get(rank) == when or now - when < self.silent_after \
                    or now - newest >= self.silent_after:
                continue
            self.flagged[rank] = when
            what = (f"rank {rank} made no step for {now - when:.0f}s while other ranks go on"
                    if by_step else
                    f"rank {rank} silent for {now - when:.0f}s while other ranks write")
            self._flag(rank, what, now)
        if not steps or now - newest < self.silent_after:
            return
        ranks = [r for r in self.last_line if r >= 0]
        writing = [r for r in ranks if now - self.last_line[r] < self.silent_after]
        # Two ranks or more silent beside it: of two, the one writing may be the waiter.
        if len(writing) == 1 and len(ranks) >= 3 and self.flagged.get(writing[0]) != newest:
            rank = writing[0]
            self.flagged[rank] = newest
            self._flag(rank, f"rank {rank} writes on while no rank made a step for "
                             f"{now - newest:.0f}s: the others likely wait for it", now)

    def _flag(self, rank: int, what: str, now: float) -> None:
        node_rank, host = self.where[rank]
        self.listener(NodeChanged(node_rank, host, NodeState.RUNNING, detail=what, time=now))

    def _where(self, rank: Optional[int]) -> Tuple[int, str, Optional[int]]:
        """(node rank, host, local rank) of a global rank: from the plan, else from
        where its lines came from; node 0 when no rank is named."""
        for node in self.plan.nodes:
            offset, nproc = getattr(node, "rank_offset", None), getattr(node, "nproc", None)
            if rank is not None and offset is not None and offset <= rank < offset + nproc:
                return node.node_rank, node.host.label, rank - offset
        if rank in self.where:
            return (*self.where[rank], None)
        return 0, self.plan.nodes[0].host.label, None

    def _capture_stacks(self):
        """(what to add to the hang's line, the stack groups) after every rank's stack
        was taken and kept in the mirror."""
        from .stacks import collect, group_stacks, render, to_json

        try:
            samples = collect(self.cluster, self.record)
        except Exception as err:  # the stop comes first; stacks are a help, not a must
            return f" (stacks could not be taken: {err})", []
        groups = group_stacks(samples)
        if self.mirror is None:
            return "", groups
        name = f"stacks-{self.plan.attempt}"
        (self.mirror / f"{name}.json").write_text(json.dumps(to_json(groups, samples), indent=1))
        self.stacks_file = self.mirror / f"{name}.txt"
        self.stacks_file.write_text(render(groups))
        return f"; every rank's stack: {self.stacks_file}", groups


def apart(groups, last_active: Dict[int, float]) -> Tuple[Optional[int], str]:
    """The rank a hang is blamed on, and why: the odd one out of the stacks (one group
    smaller than all the others, which wait), else the rank inactive longest by a clear
    margin; (None, "") when no rank stands apart."""
    taken = [g for g in groups if g.ranks and not g.stack.startswith("(no stack)")]
    if len(taken) >= 2:
        smallest = min(len(g.ranks) for g in taken)
        odd = [g for g in taken if len(g.ranks) == smallest]
        if len(odd) == 1 and all(len(g.ranks) > smallest for g in taken if g is not odd[0]):
            rank = min(odd[0].ranks)
            return rank, f"; rank {rank}'s stack differs from every other rank's"
    ranks = sorted((when, rank) for rank, when in last_active.items() if rank >= 0)
    if len(ranks) >= 2 and ranks[1][0] - ranks[0][0] >= 1.0:
        rank = ranks[0][1]
        return rank, f"; rank {rank} went quiet first, {ranks[1][0] - ranks[0][0]:.0f}s before the others"
    return None, ""
