"""The dashboard's model: what every host (or rank) is doing, built from run events.

Pure Python, no rich: ``apply(event)`` is O(1) and cheap, so the threads that read logs
are never slowed by drawing; the renderer takes a frozen ``snapshot()`` at its own pace.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

from ..events import LogBlock, LogLine, NodeChanged, NodeState, RootCause, RunFinished, RunStarted
from ..metrics import Metrics, parse_metrics


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
    speeds: Dict[int, float] = field(default_factory=dict)   # latest speed of each rank
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
        self.root_cause: Optional[RootCause] = None
        self.exit_code: Optional[int] = None
        self.selected: Optional[str] = None

    def _row(self, host: str, node_rank: int, rank: Optional[int]) -> _Row:
        key = f"rank {rank}" if self.by_rank and rank is not None and rank >= 0 else host
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = _Row(key, host, node_rank, rank if self.by_rank else None)
        return row

    def apply(self, event: object) -> None:
        with self._lock:
            if isinstance(event, LogBlock):
                self._lines(event, event.last(TAIL), event.count())
            elif isinstance(event, LogLine):
                self._lines(event, [event.text], 1)
            elif isinstance(event, NodeChanged):
                self._node(event)
            elif isinstance(event, RunStarted):
                self.run_id, self.command = event.run_id, event.command
                for rank, host in enumerate(event.hosts):
                    if not self.by_rank:
                        self._row(host, rank, None)
            elif isinstance(event, RunFinished):
                self.exit_code = event.exit_code
                self.root_cause = event.root_cause

    def _lines(self, event, lines: List[str], count: int) -> None:
        """O(1) in the number of lines: of a block of a million lines only the end is read."""
        row = self._row(event.host, event.node_rank, event.rank)
        row.lines += count
        row.tail.extend(lines)
        for text in reversed(lines[-50:]):
            if text.strip():
                row.last_line = text
                break
        for text in lines[-METRIC_LINES:]:  # the newest numbers are what a row shows
            found = parse_metrics(text)
            if found:
                row.metrics = row.metrics.merged(found)
                if found.speed is not None:
                    row.speeds[event.rank] = found.speed
        if row.state in (NodeState.PENDING, NodeState.LAUNCHING):
            row.state, row.since = NodeState.RUNNING, row.since or event.time
        who = event.who
        for text in lines[-self._recent_size:]:
            if text.strip():  # blank lines say nothing in a summary
                self._recent.append((who, event.rank, text))

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

    def keys(self) -> List[str]:
        with self._lock:
            return sorted(self._rows, key=lambda k: self._order(self._rows[k]))

    @staticmethod
    def _order(row: _Row) -> Tuple[int, int]:
        return (row.node_rank, row.rank if row.rank is not None else -1)

    def snapshot(self) -> BoardSnapshot:
        with self._lock:
            rows = sorted(self._rows.values(), key=self._order)
            views = tuple(RowView(r.key, r.host, r.node_rank, r.rank, r.state, r.since, r.until,
                                  r.exit_code, r.last_line, _summed(r), r.lines, r.note)
                          for r in rows)
            speeds = [_summed(r).speed for r in rows if r.speeds and r.state == NodeState.RUNNING]
            selected = self._rows.get(self.selected) if self.selected else None
            return BoardSnapshot(
                self.run_id, self.command, views, fold_recent(list(self._recent), self._recent_size),
                sum(speeds) if speeds else None, self.root_cause, self.exit_code,
                selected.key if selected else None,
                tuple(selected.tail) if selected else ())


def _summed(row: _Row) -> Metrics:
    """A host row's speed is its ranks' speeds added up: what that machine processes."""
    if len(row.speeds) < 2:
        return row.metrics
    return dataclasses.replace(row.metrics, speed=sum(row.speeds.values()))


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
