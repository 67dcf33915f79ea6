"""`status --all`'s table: every run on the hosts, one line each, as squeue draws a
cluster's jobs (the runs are gathered and ordered by run/holders.py)."""
from __future__ import annotations

import time
from typing import IO, List, Optional, Sequence, Tuple

from ..nodeset import fold
from ..registry.holders import SharedRun, nth

HEADERS = ("RUN", "NAME", "USER", "STATE", "HOSTS", "GPUS", "SINCE", "EXIT", "TOOK")


def age(seconds: Optional[float]) -> str:
    from ..remote.registry.holds import age as words
    return "-" if seconds is None else words(seconds)


def rows(runs: Sequence[SharedRun], now: Optional[float] = None) -> List[Tuple[str, ...]]:
    now = time.time() if now is None else now
    out = []
    for r in runs:
        state = f"queued ({nth(r.place)})" if r.state == "queued" else r.state
        out.append((r.run_id, r.name or "-", r.user, state, fold(list(r.hosts)),
                    r.gpus or "-", age(now - r.since) + " ago",
                    "-" if r.exit_code is None else str(r.exit_code), age(r.duration(now))))
    return out


def render(runs: Sequence[SharedRun], out: IO[str], now: Optional[float] = None) -> None:
    table = [HEADERS] + rows(runs, now)
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADERS))]
    for row in table:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")
