"""Hangs and silent ranks, seen from the lines the ranks write (``--hang-timeout S``).

A listener in front of the view notes when each rank last wrote a line. The monitor asks
``check(now)`` on every turn of its loop:

- a rank silent for SILENT_AFTER while another rank wrote in that time is flagged once
  (a NodeChanged detail the views show), long before the run counts as hung;
- when no rank has written for S seconds, the run is hung: every rank's stacks are
  captured (stacks.py) into ``stacks-<attempt>.txt`` / ``.json`` in the run's mirror, and
  a Failure of kind "hang" is returned: the monitor stops the run (and --max-restarts
  may restart it).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, Optional

from ..events import Listener, LogBlock, LogLine, NodeChanged, NodeState
from .outcome import Failure

SILENT_AFTER_MAX = 60.0


class HangWatch:
    def __init__(self, listener: Listener, timeout: float, plan, record,
                 cluster, mirror: Optional[Path]):
        self.listener = listener
        self.timeout = timeout
        self.silent_after = min(SILENT_AFTER_MAX, timeout / 2)
        self.plan = plan
        self.record = record
        self.cluster = cluster
        self.mirror = mirror
        self.started = time.time()
        self.last_line: Dict[int, float] = {}
        self.where: Dict[int, tuple] = {}
        self.flagged: set = set()
        self.stacks_file: Optional[Path] = None

    def __call__(self, event: object) -> None:
        if isinstance(event, (LogLine, LogBlock)):
            self.last_line[event.rank] = time.time()
            self.where[event.rank] = (event.node_rank, event.host)
            self.flagged.discard(event.rank)
        self.listener(event)

    def check(self, now: float) -> Optional[Failure]:
        newest = max(self.last_line.values(), default=self.started)
        for rank, when in self.last_line.items():
            if rank in self.flagged or now - when < self.silent_after \
                    or now - newest >= self.silent_after:
                continue
            self.flagged.add(rank)
            node_rank, host = self.where[rank]
            self.listener(NodeChanged(node_rank, host, NodeState.RUNNING,
                                      detail=f"rank {rank} silent for {now - when:.0f}s while "
                                             "other ranks write", time=now))
        if now - newest < self.timeout:
            return None
        return Failure(now, 0, self.plan.nodes[0].host.label, "hang",
                       detail=f"hung: no rank wrote a line for {self.timeout:g}s"
                              + self._capture_stacks())

    def _capture_stacks(self) -> str:
        from .stacks import collect, group_stacks, render, to_json

        try:
            samples = collect(self.cluster, self.record)
        except Exception as err:  # the stop comes first; stacks are a help, not a must
            return f" (stacks could not be taken: {err})"
        groups = group_stacks(samples)
        if self.mirror is None:
            return ""
        name = f"stacks-{self.plan.attempt}"
        (self.mirror / f"{name}.json").write_text(json.dumps(to_json(groups, samples), indent=1))
        self.stacks_file = self.mirror / f"{name}.txt"
        self.stacks_file.write_text(render(groups))
        return f"; every rank's stack: {self.stacks_file}"
