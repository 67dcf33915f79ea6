"""A run's GPU samples, read from each host's ``gpu.log``: the host's supervisor writes
it (remote/run/gpus.py), the log follower streams and mirrors it like a rank's log, and
this turns its lines into ``GpuSample`` events and finds the GPUs that sit idle.

A host is untrusted: every line is parsed strictly (check/parsers.py reads the rows, as
check reads nvidia-smi), a line that is not a sample is dropped without a word, and a
sample keeps at most MAX_GPUS GPUs, each index once.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..check.parsers import GpuUse, parse_gpu_use
from ..events import GpuSample

IDLE_UTIL = 5           # % of utilization.gpu at or under which a GPU does nothing useful
IDLE_SAMPLES = 2        # samples in a row: one low sample is a pause (a checkpoint, eval)
MAX_GPUS = 64
# Of a block of gpu.log, only its end is read: it holds IDLE_SAMPLES samples of MAX_GPUS
# GPUs several times over, and nothing older changes the newest sample or the idle rule.
TAIL_BYTES = 64 * 1024
_TIME = re.compile(r"[0-9]{1,11}(\.[0-9]{1,6})?")

Sample = Tuple[float, Tuple[GpuUse, ...]]


def parse_gpu_log(text: str) -> List[Sample]:
    """(time, GPUs) per sample, in the order of the file; rows of one sample share its
    time. Comment lines (the header), bad times and bad rows are dropped."""
    samples: List[Sample] = []
    seen: Dict[int, GpuUse] = {}
    for line in text.splitlines():
        stamp, comma, row = line.partition(",")
        if not comma or not _TIME.fullmatch(stamp.strip()):
            continue
        when = float(stamp)
        uses = parse_gpu_use(row)
        if not uses:
            continue
        if not samples or samples[-1][0] != when:
            seen = {}
            samples.append((when, ()))
        for use in uses:
            if use.index not in seen and len(seen) < MAX_GPUS:
                seen[use.index] = use
        samples[-1] = (when, tuple(seen.values()))
    return samples


class IdleWatch:
    """Which GPUs have been idle for IDLE_SAMPLES samples or more in a row, per host."""

    def __init__(self) -> None:
        self._low: Dict[Tuple[int, int], int] = {}

    def feed(self, node_rank: int, gpus: Tuple[GpuUse, ...]) -> Tuple[int, ...]:
        idle = []
        for gpu in gpus:
            key = (node_rank, gpu.index)
            low = gpu.util is not None and gpu.util <= IDLE_UTIL
            self._low[key] = self._low.get(key, 0) + 1 if low else 0
            if self._low[key] >= IDLE_SAMPLES:
                idle.append(gpu.index)
        return tuple(idle)


def _tail(data: bytes) -> bytes:
    """The last TAIL_BYTES of whole lines (a week of samples streamed to a new
    controller costs the parse of 64 KiB, not of 80 MB)."""
    if len(data) <= TAIL_BYTES:
        return data
    data = data[-TAIL_BYTES:]
    return data[data.find(b"\n") + 1:]


class GpuFeed:
    """What the log follower does with the bytes of a host's gpu.log (whole lines): one
    ``GpuSample`` for the newest sample they hold, the idle rule fed with those of the
    block's end (the views need only the last)."""

    def __init__(self) -> None:
        self.watch = IdleWatch()

    def events(self, node_rank: int, host: str, data: bytes) -> List[GpuSample]:
        samples = parse_gpu_log(_tail(data).decode("utf-8", "replace"))
        idle: Tuple[int, ...] = ()
        for _, gpus in samples:
            idle = self.watch.feed(node_rank, gpus)
        if not samples:
            return []
        when, gpus = samples[-1]
        return [GpuSample(node_rank, host, when, gpus, idle)]


def latest_sample(path: Path, node_rank: int, host: str) -> Optional[GpuSample]:
    """The newest sample of a mirrored gpu.log (its end only is read), or None."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - TAIL_BYTES - 1))  # one more: _tail cuts it at a line
            data = handle.read()
    except OSError:
        return None
    events = GpuFeed().events(node_rank, host, data)
    return events[-1] if events else None
