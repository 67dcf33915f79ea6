"""The Python stack of every rank of a running job, from every host at once, with
identical stacks grouped under their rank lists so the odd rank out stands out (which
rank is stuck in all_reduce, and where is the other one?).

    samples = collect(cluster, record)        # one RankStack per rank, in rank order
    for group in group_stacks(samples): ...   # StackGroup(stack, ranks, hosts), biggest first

Each host answers ``stacks.dump`` (remote/run/stacks.py): py-spy where the host has it,
else the stack hook the rank wrapper installs. Stacks are host text: they are shown
through the views' sanitising only, never raw.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .. import helper
from ..errors import MultihostError

DUMP_WAIT = 3.0
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_NOISE = ("# multihost stack hook", "Process ", "Python v")


@dataclass(frozen=True)
class RankStack:
    rank: Optional[int]
    host: str
    local_rank: Optional[int]
    method: Optional[str]          # "py-spy" or "faulthandler"
    stack: Optional[str]
    error: Optional[str] = None


@dataclass(frozen=True)
class StackGroup:
    stack: str                     # the normalised stack, or "(error) ..." for ranks without one
    ranks: Tuple[int, ...]
    hosts: Tuple[str, ...]


def normalise(text: str) -> str:
    """One stack as it compares: thread ids and the markers dropped; the thread a signal
    happened to land in is no difference."""
    lines = []
    for line in text.splitlines():
        if not line.strip() or line.startswith(_NOISE):
            continue
        line = _ADDRESS.sub("0x…", line.replace("Current thread", "Thread"))
        lines.append(line.rstrip())
    return "\n".join(lines)


def collect(cluster, record, wait: float = DUMP_WAIT) -> List[RankStack]:
    def one(host, transport) -> Dict:
        return helper.call(transport, "stacks.dump", {"run_id": record.run_id, "wait": wait},
                           timeout=wait * 4 + 15)

    found: List[RankStack] = []
    for result in cluster.map(one, list(record.hosts)):
        node = record.nodes[result.host.rank]
        if not result.ok:
            error = result.error.cause if isinstance(result.error, MultihostError) \
                else str(result.error)
            found += [RankStack(node.rank_offset + i, node.label, i, None, None, error)
                      for i in range(node.nproc)]
            continue
        for entry in result.value.get("ranks") or []:
            local = entry.get("local_rank")
            rank = entry.get("rank")
            if rank is None and isinstance(local, int):
                rank = node.rank_offset + local
            found.append(RankStack(rank, node.label, local, entry.get("method"),
                                   entry.get("stack"), entry.get("error")))
    return sorted(found, key=lambda s: (s.rank is None, s.rank or 0))


def group_stacks(samples: Sequence[RankStack]) -> List[StackGroup]:
    groups: Dict[str, List[RankStack]] = {}
    for sample in samples:
        key = normalise(sample.stack) if sample.stack else f"(no stack) {sample.error}"
        groups.setdefault(key, []).append(sample)
    made = [StackGroup(key, tuple(s.rank for s in members if s.rank is not None),
                       tuple(dict.fromkeys(s.host for s in members)))
            for key, members in groups.items()]
    # The biggest group first: the odd rank out comes last, where the eye lands.
    return sorted(made, key=lambda g: (-len(g.ranks), g.ranks))


def rank_list(ranks: Sequence[int]) -> str:
    """``0-3,5``: ranges of consecutive ranks."""
    parts, ordered = [], sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def render(groups: Sequence[StackGroup]) -> str:
    from ..untrusted import clean_line

    out = []
    for group in groups:
        out.append(f"ranks {rank_list(group.ranks)} ({len(group.ranks)} rank(s) on "
                   f"{', '.join(group.hosts)}):")
        out += ["    " + clean_line(line.encode()) for line in group.stack.splitlines()]
        out.append("")
    return "\n".join(out)


def to_json(groups: Sequence[StackGroup], samples: Sequence[RankStack]) -> Dict:
    return {"groups": [{"ranks": list(g.ranks), "hosts": list(g.hosts), "stack": g.stack}
                       for g in groups],
            "ranks": [s.__dict__ for s in samples]}
