"""A run's throughput, read from its ranks' log lines.

Each line is read for one number: the speed the dashboard reads (``speed:``, ``ips:``,
``... samples/s``: ``logs/metrics.py``), or the first group of the user's ``--metric
REGEX``. A rank's throughput is the median of its steady samples: the first quarter of
what it printed is warm-up (compiling, caches, the first all-reduce) and is left out.

Trainers print one of two things, and the job's throughput is read accordingly:
  global     every rank prints the job's speed (the same number at the same step, as
             examples/train_ddp.py does): it is taken once, from the lowest rank.
  per-rank   each rank prints its own (paddle's fleet examples, PaddleOCR's ``ips``): the
             job's is their sum; ranks that print nothing (a trainer that logs on rank 0
             only) count as the mean of those that do.
``auto`` tells them apart as the dashboard does: two ranks that print the same number at
the same step print the job's speed.
"""
from __future__ import annotations

import re
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Optional, Pattern, Tuple

from ..errors import ConfigError, RunFailed
from ..logs.metrics import parse_metrics

WARMUP = 0.25               # the share of each rank's samples left out as warm-up
KEEP = 20_000               # samples kept per rank: a chatty (or hostile) host is bounded
RULES = ("auto", "global", "per-rank")


def parse_metric_is(text: str) -> str:
    if text not in RULES:
        raise ConfigError(f"--metric-is {text!r} is not one of {', '.join(RULES)}",
                          fix="--metric-is global when every rank prints the job's speed, "
                              "per-rank when each prints its own")
    return text


class MetricReader:
    """One line in, (step, value) out: the value None when the line carries none."""

    def __init__(self, regex: Optional[str] = None):
        self.regex: Optional[Pattern[str]] = None
        self.label = "speed (speed:, ips:, samples/s)"
        if regex is not None:
            try:
                self.regex = re.compile(regex)
            except re.error as err:
                raise ConfigError(f"--metric {regex!r} is not a regular expression: {err}",
                                  fix=r"e.g. --metric 'ips: ([0-9.]+)'") from None
            if self.regex.groups < 1:
                raise ConfigError(f"--metric {regex!r} has no group for the number",
                                  fix=r"put the number in parentheses, e.g. 'ips: ([0-9.]+)'")
            self.label = regex

    def read(self, line: str) -> Tuple[Optional[int], Optional[float]]:
        found = parse_metrics(line)
        if self.regex is None:
            return found.step, found.speed
        match = self.regex.search(line)
        if match is None or match.group(1) is None:
            return found.step, None
        try:
            value = float(match.group(1).replace(",", ""))
        except ValueError:   # the group matched words: the line says no number
            return found.step, None
        return found.step, value if value == value and abs(value) != float("inf") else None


class Samples:
    """Every rank's values of one run as they arrive, and the highest step seen."""

    def __init__(self, reader: MetricReader):
        self.reader = reader
        self.by_rank: Dict[int, Deque[Tuple[int, float]]] = {}
        self.first_at: Optional[float] = None     # when the first value arrived
        self.top_step = 0

    def add(self, rank: int, lines, when: float) -> None:
        if rank < 0:   # the launcher's own output (torchrun's, paddle's): not a rank's
            return
        for line in lines:
            step, value = self.reader.read(line)
            if step is not None:
                self.top_step = max(self.top_step, step)
            if value is None:
                continue
            if self.first_at is None:
                self.first_at = when
            self.by_rank.setdefault(rank, deque(maxlen=KEEP)).append(
                (-1 if step is None else step, value))

    def __len__(self) -> int:
        return sum(len(values) for values in self.by_rank.values())


@dataclass(frozen=True)
class Throughput:
    value: float           # the job's throughput, in what the trainer prints (samples/s)
    rule: str              # "global" or "per-rank": how ranks were combined
    ranks: int             # ranks that printed a value
    samples: int           # steady samples used, over those ranks


def steady(values) -> list:
    """The samples after warm-up: the first quarter left out, never the last one."""
    values = list(values)
    return values[min(int(len(values) * WARMUP), len(values) - 1):]


def is_global(by_rank) -> bool:
    """Whether ranks print the job's speed: two ranks said the same value at one step."""
    seen: Dict[Tuple[int, float], int] = {}
    for rank, values in by_rank.items():
        for pair in values:
            if pair[0] >= 0 and seen.setdefault(pair, rank) != rank:
                return True
    return False


def measure(samples: Samples, world_size: int, rule: str = "auto", *,
            run_id: str = "", host: Optional[str] = None) -> Throughput:
    """The job's throughput over its steady samples, by ``rule`` (auto, global, per-rank)."""
    by_rank = {rank: values for rank, values in samples.by_rank.items() if values}
    if not by_rank:
        raise RunFailed(f"run {run_id} printed no throughput ({samples.reader.label}) "
                          "in any rank's log", host=host,
                          fix="print speed/ips/samples per second in the training loop, or "
                              "give --metric REGEX; see `multihost logs " + run_id + "`")
    if rule == "auto":
        if is_global(by_rank):
            rule = "global"
        elif len(by_rank) == 1 and world_size > 1:
            raise RunFailed(f"run {run_id}: only rank {min(by_rank)} of {world_size} prints "
                              "a throughput: it may be the job's or that rank's own",
                              host=host, fix="run the same command again with --metric-is "
                                             "global (the job's) or --metric-is per-rank (that "
                                             "rank's): safe, each point is a fresh run")
        else:
            rule = "per-rank"
    medians = {rank: statistics.median(v for _, v in steady(values))
               for rank, values in by_rank.items()}
    used = sum(len(steady(values)) for values in by_rank.values())
    if rule == "global":
        first = min(by_rank)
        return Throughput(medians[first], rule, len(by_rank), len(steady(by_rank[first])))
    mean = sum(medians.values()) / len(medians)
    return Throughput(mean * max(world_size, len(medians)), rule, len(by_rank), used)
