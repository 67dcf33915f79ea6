"""Render the dashboard of a real run to SVG, for the docs.

Feed it the JSON events of a run (``multihost run --json ...`` or ``multihost logs RUN
--follow --json``) and it draws the dashboard as it stood at a moment of that run (by
default two thirds of the way through; 1 is the end):

    multihost run --json --hostfile hosts.ini --nproc_per_node 2 -- train_ddp.py > events.jsonl
    python scripts/dashboard_svg.py events.jsonl docs/dashboard.svg [0.66]
"""
from __future__ import annotations

import json
import sys

from rich.console import Console

from multihost.events import LogLine, NodeChanged, NodeState, RootCause, RunFinished, RunStarted
from multihost.views.board import BoardModel
from multihost.views.dashboard import render


def event_of(record: dict):
    kind = record.pop("event")
    if kind == "started":
        record["hosts"] = tuple(record["hosts"])
        return RunStarted(**record)
    if kind == "line":
        return LogLine(**record)
    if kind == "node":
        record["state"] = NodeState(record["state"])
        return NodeChanged(**record)
    if kind == "finished":
        cause = record.get("root_cause")
        if cause:
            cause["tail"] = tuple(cause["tail"])
            record["root_cause"] = RootCause(**cause)
        return RunFinished(**record)
    return None


def main(source: str, target: str, at: float = 0.66, width: int = 118) -> None:
    with open(source) as lines:
        events = [e for e in (event_of(json.loads(line)) for line in lines) if e is not None]
    times = [e.time for e in events if e.time]
    moment = min(times) + (max(times) - min(times)) * at
    model = BoardModel()
    for event in events:
        if not event.time or event.time <= moment:
            model.apply(event)
    console = Console(record=True, width=width, file=open("/dev/null", "w"), force_terminal=True)
    console.print(render(model.snapshot(), now=moment, keys=True))
    with open(target, "w") as out:
        out.write(console.export_svg(title="multihost run"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:4]))
