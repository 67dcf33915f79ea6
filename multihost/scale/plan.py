"""Which host counts a scaling run measures: 1, 2, 4, ... up to every host, and every
host itself (``--counts`` names them instead). Pure: tested without a host."""
from __future__ import annotations

from typing import Sequence, Tuple, Union

from ..errors import ConfigError


def parse_counts(text: str, hosts: int) -> Tuple[int, ...]:
    """``--counts 1,3``: host counts, each 1 to ``hosts``; kept ascending, without repeats,
    so the first point is the baseline that speed-up is measured against."""
    fix = f"give host counts from 1 to {hosts}, e.g. --counts 1,{hosts}"
    words = [w.strip() for w in text.split(",")]
    if not text.strip() or any(not w.isdigit() for w in words):
        raise ConfigError(f"--counts {text!r} is not a list of host counts", fix=fix)
    counts = sorted({int(w) for w in words})
    if counts[0] < 1 or counts[-1] > hosts:
        raise ConfigError(f"--counts {text}: {hosts} host(s) are given, so a count must be "
                          f"1 to {hosts}", fix=fix)
    return tuple(counts)


def plan_counts(hosts: int, counts: Union[None, str, Sequence[int]] = None) -> Tuple[int, ...]:
    """The host counts to measure: ``--counts`` ("1,3", or a list from the Python API)
    when given, else the powers of two below ``hosts`` and ``hosts`` itself (1, 2, 4, 8,
    12 for twelve hosts)."""
    if hosts < 1:
        raise ConfigError("scaling needs at least one host", fix="give --ips or --hostfile")
    if counts is not None:
        text = counts if isinstance(counts, str) else ",".join(str(c) for c in counts)
        return parse_counts(text, hosts)
    planned = []
    count = 1
    while count < hosts:
        planned.append(count)
        count *= 2
    return tuple(planned + [hosts])
