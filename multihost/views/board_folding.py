"""The dashboard's rows as they are shown (board.py keeps them): rows in one state folded
into one, so 64 hosts x 8 ranks fit a screen, their node ranks or ranks folded for the
'#' column (0-7,16-511), and the summary line of the hosts' states. Pure Python, no rich.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..events import NodeState
from ..nodeset import fold
from .board import RowView

FOLD_ABOVE = 12            # more rows than this: rows in the same state fold into one


@dataclass(frozen=True)
class FoldedRow:
    """Rows in one state shown as one: ``rows`` in rank order, ``who`` their hosts folded
    like check's output (198.18.0.[12-40,42-74]), ``numbers`` their node ranks or ranks
    (0-7,16-511)."""
    rows: Tuple[RowView, ...]
    who: str
    numbers: str             # the '#' column: node ranks or ranks, folded


def _fold_key(row: RowView) -> tuple:
    return (row.state, row.exit_code, row.note, row.slow)


def fold_rows(rows: Sequence[RowView], selected: Optional[str] = None,
              above: int = FOLD_ABOVE) -> List[FoldedRow]:
    """Rows in the same state (state, exit code, note) folded into one, at the place of
    the first of them; the selected row always stands alone. With ``above`` rows or fewer
    every row is its own, as before. Failed and lost hosts differ in their exit code or
    note from the running ones, and stragglers in their mark, so they never hide in a
    folded row."""
    if len(rows) <= above:
        return [FoldedRow((r,), r.key, _number(r)) for r in rows]
    groups: Dict[tuple, List[RowView]] = {}
    order: List[tuple] = []
    for row in rows:
        key = ("selected",) if row.key == selected else _fold_key(row)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(row)
    folded = []
    for key in order:
        members = groups[key]
        if len(members) == 1:
            folded.append(FoldedRow(tuple(members), members[0].key, _number(members[0])))
            continue
        hosts = list(dict.fromkeys(r.host for r in members))
        folded.append(FoldedRow(tuple(members), fold(hosts), _numbers([_number(r) for r in members])))
    return folded


def _number(row: RowView) -> str:
    return str(row.rank if row.rank is not None else row.node_rank)


def _numbers(numbers: Sequence[str]) -> str:
    """'0,1,2,5' -> '0-2,5': numbers (unlike host names) have no width to keep."""
    values = sorted({int(n) for n in numbers})
    spans: List[List[int]] = []
    for value in values:
        if spans and value == spans[-1][1] + 1:
            spans[-1][1] = value
        else:
            spans.append([value, value])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


SUMMARY_STATES = (("running", (NodeState.RUNNING,)),
                  ("finished", (NodeState.SUCCEEDED, NodeState.STOPPED)),
                  ("failed", (NodeState.FAILED,)), ("lost", (NodeState.LOST,)))


def summary(rows: Sequence[RowView]) -> str:
    """'64 hosts: 60 running, 1 finished, 1 failed, 2 lost' (and how many are still
    starting, when some are): hosts, never ranks, even when rows are ranks."""
    state_of: Dict[int, NodeState] = {}
    for row in rows:
        state_of.setdefault(row.node_rank, row.state)
    counts = [(name, sum(s in states for s in state_of.values())) for name, states in SUMMARY_STATES]
    starting = sum(s in (NodeState.PENDING, NodeState.SYNCING, NodeState.LAUNCHING)
                   for s in state_of.values())
    parts = ([f"{starting} starting"] if starting else []) + [f"{n} {name}" for name, n in counts]
    hosts = len(state_of)
    return f"{hosts} host{'s' if hosts != 1 else ''}: " + ", ".join(parts)
