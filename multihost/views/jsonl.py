"""One JSON object per line and event, for other tools: ``--json``."""
from __future__ import annotations

import dataclasses
import enum
import json
import threading
from typing import IO

from ..events import (GpuSample, LogBlock, LogLine, NodeChanged, Notice, RunFinished, RunStarted,
                      RunStopping, Stragglers)

KINDS = {RunStarted: "started", LogLine: "line", NodeChanged: "node", Notice: "notice",
         RunStopping: "stopping", Stragglers: "stragglers", GpuSample: "gpu",
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
        with self._lock:
            self.out.write(json.dumps(record, default=str) + "\n")
            self.out.flush()
