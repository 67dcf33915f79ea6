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


def expand(text: str, where: str = "node set") -> List[str]:
    """The names a node set stands for, in the order written: ``10.0.0.[1-3],gpu[01-02]``
    -> 10.0.0.1, 10.0.0.2, 10.0.0.3, gpu01, gpu02 (the inverse of ``fold``, as clush
    writes them). Several bracket groups multiply (``r[1-2]n[1-2]``); a range keeps the
    width of its first number (``[08-10]`` -> 08, 09, 10)."""
    names: List[str] = []
    for item in _top_level_items(text, where):
        names.extend(_expand_item(item, where))
    return names


def _top_level_items(text: str, where: str) -> List[str]:
    from .errors import ConfigError

    items, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth not in (0, 1):
            raise ConfigError(f"{where}: {text!r} has unbalanced brackets",
                              fix="write ranges like node[1-4] or 10.0.0.[1-4]")
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise ConfigError(f"{where}: {text!r} has '[' without ']'",
                          fix="write ranges like node[1-4] or 10.0.0.[1-4]")
    items.append(current)
    for item in items:
        if not item.strip():
            raise ConfigError(f"{where}: {text!r} has an empty name",
                              fix="separate names with single commas, e.g. node1,node2")
    return [item.strip() for item in items]


_GROUP = re.compile(r"\[([^\]]*)\]")


def _expand_item(item: str, where: str) -> List[str]:
    from .errors import ConfigError

    match = _GROUP.search(item)
    if not match:
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    values: List[str] = []
    for part in match.group(1).split(","):
        low, dash, high = part.strip().partition("-")
        if not _digits(low) or (dash and not _digits(high)):
            raise ConfigError(f"{where}: [{match.group(1)}] in {item!r} is not a list of "
                              "numbers and ranges", fix="write ranges like [1-4] or [01-08,10]")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low) or int(high) - int(low) >= 100000:
            raise ConfigError(f"{where}: the range {part.strip()} in {item!r} is backwards "
                              "or too large", fix="write ranges low to high, e.g. [1-4]")
        values.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return [head + value + rest for value in values for rest in _expand_item(tail, where)]


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() takes any script's (a fullwidth '１')."""
    return text.isascii() and text.isdigit()
