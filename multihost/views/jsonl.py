"""One JSON object per line and event, for other tools: ``--json``.

A line or a progress bar's state that carries numbers (logs/metrics.py) is followed by a
``metrics`` record of the rank: ``{"event": "metrics", "rank": 0, "step": 9, "loss":
0.69, ...}``, so a tool reads a run's progress without parsing its lines."""
from __future__ import annotations

import dataclasses
import enum
import json
import threading
from typing import IO

from ..events import (GpuSample, LogBlock, LogLine, LogProgress, NodeChanged, Notice, RunFinished,
                      RunStarted, RunStopping, Stragglers)
from ..logs.metrics import parse_metrics

KINDS = {RunStarted: "started", LogLine: "line", LogProgress: "progress", NodeChanged: "node",
         Notice: "notice", RunStopping: "stopping", Stragglers: "stragglers", GpuSample: "gpu",
         RunFinished: "finished"}


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    return value


class JsonView:
    def __init__(self, out: IO[str]):
        self.out = out
        self._lock = threading.Lock()

    def __call__(self, event: object) -> None:
        if isinstance(event, LogBlock):
            for line in event.split():
                self(line)
            return
        kind = KINDS.get(type(event))
        if kind is None and type(event).__name__ == "Metrics":
            kind = "metrics"
        if kind is None or not dataclasses.is_dataclass(event):
            return
        record = {"event": kind}
        record.update({k: _plain(v) for k, v in dataclasses.asdict(event).items()})
        records = [record]
        if isinstance(event, (LogLine, LogProgress)) and not event.role:
            found = parse_metrics(event.text)
            if found:
                records.append({"event": "metrics", "node_rank": event.node_rank,
                                "host": event.host, "rank": event.rank, "time": event.time,
                                **dataclasses.asdict(found)})
        with self._lock:
            for one in records:
                self.out.write(json.dumps(one, default=str) + "\n")
            self.out.flush()
