"""Every rank's progress while a run is followed: a listener in front of the view.

It reads the step and speed of each rank's newest lines (logs/metrics.py, the parser the
dashboard uses) into a Pace (stragglers.py), and on the monitor's turns judges, at most
every JUDGE_EVERY seconds, who is a straggler. When that changes, a Stragglers event
goes to the view and the list goes into the run's record (``status`` shows it). The
step times it keeps are what ``--hang-timeout`` judges ranks that print steps by
(hangs.py).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional, Tuple

from ..events import Listener, LogBlock, LogLine, LogProgress, Stragglers
from ..logs.metrics import Metrics, parse_metrics
from .stragglers import Pace, Straggler, describe, to_json

JUDGE_EVERY = 2.0       # 512 ranks with a line every 0.1 s: about 70 ms a judgment
METRIC_LINES = 20       # of a block, the newest lines are read: O(1) in its size


def newest_metrics(lines) -> Metrics:
    """The numbers of the newest line that tells a step or a speed: read from the end,
    so a block usually costs one parse (its last line), not twenty."""
    for text in reversed(lines):
        parsed = parse_metrics(text)
        if parsed.step is not None or parsed.speed is not None:
            return parsed
    return Metrics()


class ProgressWatch:
    def __init__(self, listener: Listener, save: Callable[[list], None] = lambda items: None):
        self.listener = listener
        self.save = save          # the record's list of stragglers (RecordKeeper.update)
        self.pace = Pace()
        self.lock = threading.Lock()
        self.judged_at = 0.0
        self.marked: Tuple[Straggler, ...] = ()

    def __call__(self, event: object) -> None:
        if isinstance(event, (LogBlock, LogLine, LogProgress)) and event.rank >= 0 and not event.role:
            lines = event.last(METRIC_LINES) if isinstance(event, LogBlock) else [event.text]
            found = newest_metrics(lines)
            if found.step is not None or found.speed is not None:
                with self.lock:
                    self.pace.note(event.rank, event.node_rank, event.host,
                                   event.time or time.time(), found.step, found.speed)
        self.listener(event)

    def last_advance(self, rank: int) -> Optional[float]:
        """When the rank's step last moved; None for a rank whose lines carry no step."""
        with self.lock:
            return self.pace.last_advance.get(rank)

    def tick(self, now: float) -> None:
        """Judge again (the monitor's loop calls this every turn; cheap between judgments)."""
        if now - self.judged_at < JUDGE_EVERY:
            return
        self.judged_at = now
        with self.lock:
            verdict = self.pace.judge(now)
        if verdict is None or not self._changed(verdict):
            return   # too few ranks to judge (the end of a run): the last marks stand
        self.marked = verdict
        self.save(to_json(verdict))
        self.listener(Stragglers(verdict, describe(verdict), now))

    def _changed(self, verdict: Tuple[Straggler, ...]) -> bool:
        if [s.rank for s in verdict] != [s.rank for s in self.marked]:
            return True
        # A percentage that moved is said again (the views show the newest); a ratio
        # moving in its third digit is not news.
        return any((new.slower, new.whole_host) != (old.slower, old.whole_host)
                   for new, old in zip(verdict, self.marked))
