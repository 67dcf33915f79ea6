"""The dashboard's model: what every host (or rank) is doing, built from run events.

Pure Python, no rich: ``apply(event)`` is O(1) and cheap, so the threads that read logs
are never slowed by drawing; the renderer takes a frozen ``snapshot()`` at its own pace
(and board_folding.py folds its rows for the screen).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

from ..events import (GpuSample, LogBlock, LogLine, LogProgress, NodeChanged, NodeState, Notice, RootCause,
                      RunFinished, RunStarted, RunStopping, Stragglers)
from ..logs.metrics import Metrics, parse_metrics


METRIC_LINES = 20
TAIL = 200                 # lines kept per row, for the full-log panel


@dataclass(frozen=True)
class RowView:
    key: str                 # what the first column shows: host, or "rank N"
    host: str
    node_rank: int
    rank: Optional[int]
    state: NodeState
    since: Optional[float]   # when it started running
    until: Optional[float]   # when it finished
    exit_code: Optional[int]
    last_line: str
    metrics: Metrics
    lines: int
    note: str = ""           # what multihost says of the node ("contact lost ...")
    slow: str = ""           # a straggler: "slow -35%" (or "rank 5 slow -35%" on a host row)
    gpu: Optional[GpuSample] = None   # the host's latest GPU sample


@dataclass(frozen=True)
class RecentLine:
    who: str                 # "198.18.0.11 [0]" or folded "ranks 0-5"
    text: str
    count: int = 1


@dataclass(frozen=True)
class BoardSnapshot:
    run_id: str
    command: str
    rows: Tuple[RowView, ...]
    recent: Tuple[RecentLine, ...]
    total_speed: Optional[float]
    root_cause: Optional[RootCause]
    exit_code: Optional[int]           # set when the run finished
    selected: Optional[str] = None     # the row whose full log is shown
    selected_lines: Tuple[str, ...] = field(default_factory=tuple)
    stopping: Optional[RunStopping] = None    # multihost asked the hosts to stop
    speed_is_global: bool = False      # every rank prints the job's speed: shown once, not summed
    speed_label: str = ""              # what total_speed is: "summed speed of 4 ranks", ...
    stragglers: str = ""               # "h3 rank 5 at 0.62x the median speed", while some are


@dataclass
class _Row:
    key: str
    host: str
    node_rank: int
    rank: Optional[int]
    state: NodeState = NodeState.PENDING
    since: Optional[float] = None
    until: Optional[float] = None
    exit_code: Optional[int] = None
    last_line: str = ""
    metrics: Metrics = Metrics()
    speeds: Dict[int, Tuple[int, float]] = field(default_factory=dict)  # rank: (step, speed)
    lines: int = 0
    note: str = ""
    tail: Deque[str] = field(default_factory=lambda: deque(maxlen=TAIL))


class BoardModel:
    def __init__(self, by_rank: bool = False, recent: int = 10):
        self.by_rank = by_rank
        self._lock = threading.Lock()
        self._rows: Dict[str, _Row] = {}
        self._recent: Deque[Tuple[str, int, str]] = deque(maxlen=recent * 4)
        self._recent_size = recent
        self.run_id = ""
        self.command = ""
        self.world = 0                  # ranks in the job, once the run started
        self.root_cause: Optional[RootCause] = None
        self.exit_code: Optional[int] = None
        self.selected: Optional[str] = None
        self.stopping: Optional[RunStopping] = None
        # Whether the trainer prints the job's global speed on every rank (two ranks
        # said the same speed at the same step): then summing would count it N times.
        self.speed_is_global = False
        self._speeds_seen: Dict[Tuple[int, float], int] = {}
        self._slow: Optional[Stragglers] = None
        self._gpus: Dict[int, GpuSample] = {}   # node rank: its latest GPU sample

    def _row(self, host: str, node_rank: int, rank: Optional[int]) -> _Row:
        key = f"rank {rank}" if self.by_rank and rank is not None and rank >= 0 else host
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = _Row(key, host, node_rank, rank if self.by_rank else None)
            # By rank, a node's state may come before any of its ranks has spoken: it
            # waited in a row of the host, which the rank rows take over (and a later
            # rank row starts in the state its node's rows are in).
            same_node = [r for r in self._rows.values() if r.node_rank == node_rank and r is not row]
            if self.by_rank and same_node:
                for name in ("state", "since", "until", "exit_code", "note"):
                    setattr(row, name, getattr(same_node[0], name))
                if same_node[0].rank is None and same_node[0].key == host:
                    del self._rows[host]
        return row

    def apply(self, event: object) -> None:
        with self._lock:
            if isinstance(event, LogBlock):
                self._lines(event, event.last(TAIL), event.count())
            elif isinstance(event, LogLine):
                self._lines(event, [event.text], 1)
            elif isinstance(event, LogProgress):
                self._progress(event)
            elif isinstance(event, NodeChanged):
                self._node(event)
            elif isinstance(event, Notice):
                for row in self._rows.values():
                    if row.node_rank == event.node_rank:
                        row.note = event.text
            elif isinstance(event, RunStarted):
                self.run_id, self.command = event.run_id, event.command
                self.world = len(event.hosts) * event.nproc_per_node
                if event.name:  # "bert-large (RUN)": what its users call it
                    self.run_id = f"{event.name} ({event.run_id})"
                if event.attempt:  # shown in the title: "RUN, attempt 2 of 3"
                    self.run_id = f"{self.run_id}, {event.attempt}"
                for rank, host in enumerate(event.hosts):
                    if not self.by_rank:
                        self._row(host, rank, None)
                if event.replaced:  # under the title: the spares that took a rank
                    self.command = f"{'; '.join(event.replaced)}  |  {event.command}"
            elif isinstance(event, GpuSample):
                self._gpus[event.node_rank] = event
            elif isinstance(event, RunStopping):
                self.stopping = event
            elif isinstance(event, Stragglers):
                self._slow = event
            elif isinstance(event, RunFinished):
                self.exit_code = event.exit_code
                self.root_cause = event.root_cause

    def _lines(self, event, lines: List[str], count: int) -> None:
        """O(1) in the number of lines: of a block of a million lines only the end is read."""
        row = self._row(event.host, event.node_rank, event.rank)
        row.lines += count
        if self.by_rank:
            row.tail.extend(lines)
        else:  # a host's log panel mixes its ranks: each line keeps its rank
            mark = f"[{event.rank}] " if event.rank >= 0 else "[launcher] "
            row.tail.extend(mark + text for text in lines)
        for text in reversed(lines[-50:]):
            if text.strip():
                row.last_line = text
                break
        for text in lines[-METRIC_LINES:]:  # the newest numbers are what a row shows
            self._metrics(row, event.rank, text)
        self._running(row, event.time)
        who = event.who
        for text in lines[-self._recent_size:]:
            if text.strip():  # blank lines say nothing in a summary
                self._recent.append((who, event.rank, text))

    def _progress(self, event: LogProgress) -> None:
        """A bar's latest state: the row's numbers and last line, not a line of its log."""
        row = self._row(event.host, event.node_rank, event.rank)
        row.last_line = event.text
        self._metrics(row, event.rank, event.text)
        self._running(row, event.time)

    def _metrics(self, row: _Row, rank: int, text: str) -> None:
        """The numbers one line gives, merged into the row's."""
        found = parse_metrics(text)
        if found:
            row.metrics = row.metrics.merged(found)
            if found.speed is not None:
                self._speed(row, rank, row.metrics.step, found.speed)

    @staticmethod
    def _running(row: _Row, since: float) -> None:
        """A rank that speaks has launched."""
        if row.state in (NodeState.PENDING, NodeState.LAUNCHING):
            row.state, row.since = NodeState.RUNNING, row.since or since

    def _speed(self, row: _Row, rank: int, step: Optional[int], speed: float) -> None:
        key = (-1 if step is None else step, speed)
        row.speeds[rank] = key
        first = self._speeds_seen.setdefault(key, rank)
        if first != rank:
            self.speed_is_global = True
        if len(self._speeds_seen) > 4096:  # bounded: only recent steps can match
            self._speeds_seen = {key: rank}

    def _node(self, event: NodeChanged) -> None:
        rows = [r for r in self._rows.values() if r.node_rank == event.node_rank] \
            or [self._row(event.host, event.node_rank, None)]
        for row in rows:
            row.state = event.state
            row.note = event.detail if event.detail != "contact restored" else ""
            if event.state == NodeState.RUNNING and row.since is None:
                row.since = event.time or time.time()
            if event.state.finished or event.state == NodeState.LOST:
                row.until = event.time or time.time()
                row.exit_code = event.exit_code

    def select(self, key: Optional[str]) -> None:
        with self._lock:
            self.selected = key if key in self._rows else None

    def select_number(self, number: int) -> bool:
        """Pick the row whose '#' is ``number`` (its rank, or its node rank): the way to
        reach any of 64 hosts or 512 ranks, where keys 1-9 reach nine."""
        with self._lock:
            for row in self._rows.values():
                if (row.rank if row.rank is not None else row.node_rank) == number:
                    self.selected = row.key
                    return True
            return False

    def step(self, by: int) -> None:
        """Select the next (by=1) or previous (by=-1) row, wrapping around."""
        keys = self.keys()
        if not keys:
            return
        with self._lock:
            at = keys.index(self.selected) if self.selected in keys else (-1 if by > 0 else 0)
            self.selected = keys[(at + by) % len(keys)]

    def keys(self) -> List[str]:
        with self._lock:
            return sorted(self._rows, key=lambda k: self._order(self._rows[k]))

    @staticmethod
    def _order(row: _Row) -> Tuple[int, int]:
        return (row.node_rank, row.rank if row.rank is not None else -1)

    def snapshot(self) -> BoardSnapshot:
        with self._lock:
            rows = sorted(self._rows.values(), key=self._order)
            glob = self.speed_is_global
            views = tuple(RowView(r.key, r.host, r.node_rank, r.rank, r.state, r.since, r.until,
                                  r.exit_code, r.last_line, _summed(r, glob), r.lines, r.note,
                                  gpu=self._gpus.get(r.node_rank), slow=self._slow_mark(r))
                          for r in rows)
            running = {rank: pair for r in rows if r.state == NodeState.RUNNING
                       for rank, pair in r.speeds.items()}
            total, label = job_speed(running, glob, self.world)
            selected = self._rows.get(self.selected) if self.selected else None
            return BoardSnapshot(
                self.run_id, self.command, views, fold_recent(list(self._recent), self._recent_size),
                total, self.root_cause, self.exit_code,
                selected.key if selected else None,
                tuple(selected.tail) if selected else (), self.stopping, glob, label,
                stragglers=self._slow.text if self._slow else "")

    def _slow_mark(self, row: _Row) -> str:
        """``slow -35%`` on a straggler's row; on a host row, the host's when every rank
        of it is slow, else each slow rank's: ``rank 5 slow -35%``."""
        if self._slow is None:
            return ""
        if row.rank is not None:
            return next((f"slow {s.slower}%" for s in self._slow.stragglers if s.rank == row.rank), "")
        mine = [s for s in self._slow.stragglers if s.node_rank == row.node_rank]
        if mine and all(s.whole_host for s in mine):
            return f"slow {round(sum(s.slower for s in mine) / len(mine))}%"
        return ", ".join(f"rank {s.rank} slow {s.slower}%" for s in mine)


def job_speed(by_rank: Dict[int, Tuple[int, float]], is_global: bool,
              world: int) -> Tuple[Optional[float], str]:
    """The job's speed and what it is, by the rule of `multihost scale` (scale/measure.py):
    the job's own figure when every rank prints the same one; else each rank's own speed,
    so ranks that print none (PaddleSeg prints on rank 0 only, per card) count at the mean
    of those that do, and the label says so."""
    pairs = list(by_rank.values())
    if not pairs:
        return None, ""
    if is_global:
        return combined_speed(pairs, True), "the job's speed (every rank prints it)"
    speeds = [speed for _, speed in pairs]
    if len(speeds) >= world:
        return sum(speeds), f"summed speed of {len(speeds)} ranks"
    mean = sum(speeds) / len(speeds)
    who = f"rank {min(by_rank)}'s speed" if len(speeds) == 1 else \
        f"the mean of the {len(speeds)} ranks that print one"
    return mean * world, f"{who} x {world} ranks (as if each rank's own)"


def combined_speed(pairs: List[Tuple[int, float]], is_global: bool) -> Optional[float]:
    """Ranks' (step, speed) as one figure: their sum when each rank prints its own
    speed; the newest one when every rank prints the job's (summing would count it once
    per rank)."""
    if not pairs:
        return None
    if is_global:
        return max(pairs)[1]
    return sum(speed for _, speed in pairs)


def _summed(row: _Row, is_global: bool) -> Metrics:
    """A host row's speed is its ranks' speeds added up: what that machine processes."""
    if len(row.speeds) < 2:
        return row.metrics
    return dataclasses.replace(row.metrics,
                               speed=combined_speed(list(row.speeds.values()), is_global))


def fold_recent(recent: List[Tuple[str, int, str]], size: int) -> Tuple[RecentLine, ...]:
    """The last ``size`` distinct lines; one line printed by many ranks shows once, counted."""
    folded: List[RecentLine] = []
    index: Dict[str, int] = {}
    for who, rank, text in recent:
        if text in index and text.strip():
            first = folded[index[text]]
            folded[index[text]] = RecentLine(f"{first.count + 1} ranks", text, first.count + 1)
            continue
        index[text] = len(folded)
        folded.append(RecentLine(who, text))
    return tuple(folded[-size:])
