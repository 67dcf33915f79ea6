"""Every rank's pace, read from its lines: its steps, its speed, and who is a straggler.

A pure model (no clock, no I/O): ``Pace.note`` takes what one rank's newest lines said
(step and speed, parsed by logs/metrics.py) at the time they arrived; ``Pace.judge(now)``
compares the ranks over the last WINDOW seconds only, so start-up (imports, the first
compiled steps) stops counting once it is WINDOW seconds old:

- a rank's pace is its mean printed speed in the window, or where not enough ranks print
  a speed, its step rate: steps made over the time between its first and last sample
  in the window (a step counter that drops, a new epoch, counts from 0 again);
- a rank needs MIN_SAMPLES samples in the window to be judged, and no one is judged
  with fewer than MIN_RANKS ranks: a median of two says nothing;
- a rank more than SLOWER_BY slower than the median of the judged ranks is a straggler;
  a host whose every judged rank is one is a slow host (``Straggler.whole_host``).

``Pace.last_advance`` (when a rank's step last moved) is what the step rule of
``--hang-timeout`` reads (hangs.py).
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Iterable, List, Optional, Sequence, Tuple

WINDOW = 30.0          # seconds of samples a judgment looks at
MIN_SAMPLES = 5        # samples of a rank in the window before it is judged
MIN_RANKS = 3          # ranks judged before anyone is marked
SLOWER_BY = 0.20       # more than this much slower than the median: a straggler
MAX_SAMPLES = 512      # per rank, whatever the window holds: bounded memory

SPEED = "speed"
STEP_RATE = "step rate"


@dataclass(frozen=True)
class Sample:
    time: float
    step: Optional[int] = None
    speed: Optional[float] = None


@dataclass(frozen=True)
class Straggler:
    host: str
    node_rank: int
    rank: int
    ratio: float            # its pace over the median pace: 0.62 is 38% slower
    measure: str            # SPEED or STEP_RATE
    whole_host: bool = False   # every judged rank of its host is a straggler too

    @property
    def slower(self) -> int:
        """How much slower than the median, in percent, as the dashboard shows it (-38)."""
        return round((self.ratio - 1) * 100)


def step_rate(samples: Sequence[Sample]) -> Optional[float]:
    """Steps per second between the first and the last sample that carry a step."""
    stepped = [s for s in samples if s.step is not None]
    if len(stepped) < 2 or stepped[-1].time <= stepped[0].time:
        return None
    made = 0
    for before, after in zip(stepped, stepped[1:]):
        made += after.step - before.step if after.step >= before.step else after.step
    return made / (stepped[-1].time - stepped[0].time)


def mean_speed(samples: Sequence[Sample]) -> Optional[float]:
    speeds = [s.speed for s in samples if s.speed is not None]
    return sum(speeds) / len(speeds) if speeds else None


def paces(window: Dict[int, List[Sample]]) -> Tuple[str, Dict[int, float]]:
    """The measure the ranks are compared by, and each judged rank's pace by it: their
    printed speed where MIN_RANKS ranks print one often enough, else their step rate."""
    speeds = {rank: mean_speed(s) for rank, s in window.items()
              if sum(x.speed is not None for x in s) >= MIN_SAMPLES}
    if len(speeds) >= MIN_RANKS:
        return SPEED, {rank: v for rank, v in speeds.items() if v is not None}
    rates = {rank: step_rate(s) for rank, s in window.items()
             if sum(x.step is not None for x in s) >= MIN_SAMPLES}
    return STEP_RATE, {rank: v for rank, v in rates.items() if v is not None}


def stragglers_among(measure: str, pace: Dict[int, float],
                     where: Dict[int, Tuple[int, str]]) -> Optional[Tuple[Straggler, ...]]:
    """Who is more than SLOWER_BY slower than the median; None when too few ranks (or
    no pace at all: a median of 0) allow a judgment."""
    if len(pace) < MIN_RANKS:
        return None
    median = statistics.median(pace.values())
    if median <= 0:
        return None
    slow = {rank: value / median for rank, value in pace.items()
            if value < (1 - SLOWER_BY) * median}
    judged_on: Dict[int, List[int]] = {}
    for rank in pace:
        judged_on.setdefault(where[rank][0], []).append(rank)
    return tuple(Straggler(where[rank][1], where[rank][0], rank, round(ratio, 3), measure,
                           all(r in slow for r in judged_on[where[rank][0]]))
                 for rank, ratio in sorted(slow.items()))


class Pace:
    """Samples of every rank, newest last; not thread-safe (its owner holds a lock)."""

    def __init__(self, window: float = WINDOW):
        self.window = window
        self.samples: Dict[int, Deque[Sample]] = {}
        self.where: Dict[int, Tuple[int, str]] = {}      # rank: (node rank, host)
        self.last_advance: Dict[int, float] = {}         # rank: when its step last moved
        self._last_step: Dict[int, int] = {}

    def note(self, rank: int, node_rank: int, host: str, when: float,
             step: Optional[int] = None, speed: Optional[float] = None) -> None:
        if speed is not None and not (math.isfinite(speed) and speed >= 0):
            speed = None   # "speed: 1e999" from a host is no pace: it would skew the median
        if step is None and speed is None:
            return
        self.where[rank] = (node_rank, host)
        samples = self.samples.setdefault(rank, deque(maxlen=MAX_SAMPLES))
        samples.append(Sample(when, step, speed))
        while samples[0].time < when - self.window:   # judged over the window only
            samples.popleft()
        if step is not None and self._last_step.get(rank) != step:
            self._last_step[rank] = step
            self.last_advance[rank] = when

    def steps(self, rank: int) -> bool:
        """Whether the rank's lines carry a step (the step rule of hangs applies to it)."""
        return rank in self.last_advance

    def judge(self, now: float) -> Optional[Tuple[Straggler, ...]]:
        """The stragglers of the last ``window`` seconds; None when no judgment is possible."""
        since = now - self.window
        window = {rank: [s for s in samples if s.time >= since]
                  for rank, samples in self.samples.items()}
        measure, pace = paces(window)
        return stragglers_among(measure, pace, self.where)


def describe(stragglers: Iterable[Straggler]) -> str:
    """``198.18.0.13 rank 5 at 0.62x the median speed``; a host of several ranks, all slow,
    once: ``198.18.0.13 (ranks 4,5: the whole host) at 0.62x the median step rate``."""
    parts: List[str] = []
    done: set = set()
    items = list(stragglers)
    for item in items:
        if item.node_rank in done:
            continue
        same = [s for s in items if s.node_rank == item.node_rank]
        if item.whole_host and len(same) > 1:
            done.add(item.node_rank)
            ratio = sum(s.ratio for s in same) / len(same)
            ranks = ",".join(str(s.rank) for s in same)
            parts.append(f"{item.host} (ranks {ranks}: the whole host) at {ratio:.2f}x "
                         f"the median {item.measure}")
        else:
            parts.append(f"{item.host} rank {item.rank} at {item.ratio:.2f}x "
                         f"the median {item.measure}")
    return "; ".join(parts)


def to_json(stragglers: Iterable[Straggler]) -> List[dict]:
    """As the run's record and ``status --json`` hold them."""
    return [{"host": s.host, "node_rank": s.node_rank, "rank": s.rank, "ratio": s.ratio,
             "measure": s.measure, "whole_host": s.whole_host} for s in stragglers]


def from_json(items: Iterable[dict]) -> Tuple[Straggler, ...]:
    out = []
    for item in items or ():
        try:
            out.append(Straggler(str(item["host"]), int(item["node_rank"]), int(item["rank"]),
                                 float(item["ratio"]), str(item.get("measure", SPEED)),
                                 bool(item.get("whole_host", False))))
        except (KeyError, TypeError, ValueError):
            continue   # a record edited by hand: what is readable is shown
    return tuple(out)
