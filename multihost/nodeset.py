"""Fold host names into ClusterShell-style ranges: 198.18.0.11, .12, .13 -> 198.18.0.[11-13].

Used wherever many hosts share one outcome, so 64 identical lines print as one.
"""
from __future__ import annotations

import re
from typing import Dict, List, Sequence, Tuple

_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


def _ranges(numbers: List[Tuple[int, str]]) -> List[str]:
    """Consecutive runs of (value, text) pairs as 'a-b' or 'a'; width is kept (node01)."""
    parts: List[str] = []
    ordered = sorted(set(numbers))
    start = prev = ordered[0]
    for item in ordered[1:] + [None]:  # type: ignore[list-item]
        if item is not None and item[0] == prev[0] + 1 and len(item[1]) == len(prev[1]):
            prev = item
            continue
        parts.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
        if item is not None:
            start = prev = item
    return parts


def fold(names: Sequence[str]) -> str:
    """One compact string for a list of names; groups keep the order they first appear in."""
    groups: Dict[str, List[Tuple[int, str]]] = {}
    plain: List[str] = []
    order: List[str] = []
    for name in names:
        match = _TRAILING_NUMBER.match(name)
        if not match or ":" in name:
            plain.append(name)
            order.append(name)
            continue
        prefix, digits = match.groups()
        if prefix not in groups:
            groups[prefix] = []
            order.append("\0" + prefix)
        groups[prefix].append((int(digits), digits))
    out = []
    for key in order:
        if not key.startswith("\0"):
            out.append(key)
            continue
        prefix = key[1:]
        ranges = _ranges(groups[prefix])
        single = len(ranges) == 1 and "-" not in ranges[0]
        out.append(prefix + ranges[0] if single else f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)
