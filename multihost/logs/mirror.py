"""Read a run's log mirror on the controller: the lines of every rank, filtered.

The mirror (``<log_dir>/<run_id>/<host>/log/workerlog.N``, written by ``follow.py``; its
layout: ``mirror_layout.py``) is a byte-exact copy of each rank's log; beside each file,
``.<name>.times`` records when each chunk arrived (``offset epoch`` per line), which is
what ``--since`` filters on: the controller saw those lines within a fraction of a
second of their writing.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from ..events import LogBlock, LogLine
from .echo import LauncherEcho, fold_signal_trace

from .frames import LineJoiner
from .mirror_layout import Node, local_rank_of, mirror_path, role_of, times_path
from ..untrusted import clean_block

CHUNK = 1 << 20


@dataclass(frozen=True)
class LineFilter:
    ranks: Optional[Set[int]] = None        # global ranks (-1: the launcher's own lines)
    hosts: Optional[Set[str]] = None        # host labels or names
    pattern: Optional["re.Pattern[str]"] = None
    since: Optional[float] = None           # epoch seconds
    roles: Optional[Set[str]] = None        # "server", "worker" (a rank), "launcher"

    @property
    def everything(self) -> bool:
        return self.ranks is None and self.hosts is None and self.pattern is None \
            and self.since is None and self.roles is None

    def accepts(self, line: LogLine) -> bool:
        return self.accepts_source(line.host, line.rank, line.time, line.role) and \
            (self.pattern is None or bool(self.pattern.search(line.text)))

    def accepts_source(self, host: str, rank: int, when: float, role: str = "") -> bool:
        """Whether lines of this host and rank, arrived at this time, can pass at all."""
        if self.roles is not None and \
                (role or ("worker" if rank >= 0 else "launcher")) not in self.roles:
            return False
        if self.ranks is not None and rank not in self.ranks:
            return False
        if self.hosts is not None and host not in self.hosts:
            return False
        return self.since is None or when >= self.since

    def block(self, block: LogBlock) -> Optional[LogBlock]:
        """The block with only the lines that pass, or None."""
        if self.everything:
            return block
        if not self.accepts_source(block.host, block.rank, block.time, block.role):
            return None
        if self.pattern is None:
            return block
        kept = [text for text in block.lines if self.pattern.search(text)]
        return dataclasses.replace(block, text="\n".join(kept)) if kept else None


def _arrivals(log_file: Path) -> Tuple[List[int], List[float]]:
    offsets: List[int] = []
    times: List[float] = []
    try:
        for entry in times_path(log_file).read_text().splitlines():
            offset, when = entry.split()
            offsets.append(int(offset))
            times.append(float(when))
    except (OSError, ValueError):
        pass
    return offsets, times


def _segments(path: Path) -> Iterator[Tuple[bytes, float]]:
    """The file as (whole lines, arrival time) pieces: one per chunk as it arrived, cut
    into pieces of at most 1 MiB; a file without an index is one piece of time 0."""
    offsets, times = _arrivals(path)
    if not offsets or offsets[0] != 0:
        offsets, times = [0] + offsets, [0.0] + times
    size = path.stat().st_size
    bounds = offsets[1:] + [size]
    joiner = LineJoiner()  # a line without newlines for 100 MB is held as its start only
    with open(path, "rb") as handle:
        for start, end, when in zip(offsets, bounds, times):
            handle.seek(start)
            left = end - start
            while left > 0:
                data = handle.read(min(left, CHUNK))
                if not data:
                    break
                left -= len(data)
                whole = joiner.feed(data)
                if whole:
                    yield whole, when
            if start == offsets[-1]:  # a last line without newline
                rest = joiner.flush()
                if rest:
                    yield rest, when


def read_node(mirror_dir: Path, node: Node) -> Iterator[LogBlock]:
    """Every mirrored line of one host as blocks, file by file, each file in order."""
    directory = mirror_path(mirror_dir, node.host)
    files = [directory / "launcher.log"] + \
        sorted((directory / "log").glob("serverlog.*"), key=lambda p: local_rank_of(f"log/{p.name}")) + \
        sorted((directory / "log").glob("workerlog.*"), key=lambda p: local_rank_of(f"log/{p.name}"))
    echo = LauncherEcho()   # paddle's launcher copies rank 0's lines: show them once
    rank0 = directory / "log" / "workerlog.0"
    if rank0.is_file():
        for data, _ in _segments(rank0):
            echo.rank0(clean_block(data))
    for path in files:
        if not path.is_file():
            continue
        name = "launcher.log" if path.name == "launcher.log" else f"log/{path.name}"
        local = local_rank_of(name)
        role = role_of(name)
        rank = node.first_rank + local if local >= 0 and not role else -1
        if role:   # a parameter server: its index across the job, as the live view says
            local += node.first_server
        for data, when in _segments(path):
            text = clean_block(data)
            if local < 0:
                text = echo.launcher(fold_signal_trace(text))
                if text is None:
                    continue
            yield LogBlock(node.host.rank, node.host.label, local, rank, text, when, role)


def _last_lines(blocks: List[LogBlock], count: int) -> List[LogBlock]:
    kept: List[LogBlock] = []
    for block in reversed(blocks):
        if count <= 0:
            break
        lines = block.count()
        kept.append(block if lines <= count else
                    dataclasses.replace(block, text="\n".join(block.last(count))))
        count -= lines
    return kept[::-1]


def read_mirror(mirror_dir: Path, nodes: Sequence[Node], keep: LineFilter,
                tail: Optional[int] = None) -> List[LogBlock]:
    """The lines that pass the filter, in rank order; ``tail`` keeps the last N per rank."""
    chosen: List[LogBlock] = []
    servers = 0
    for node in nodes:
        # Servers are numbered across the hosts in order: each host mirrors its own.
        node = dataclasses.replace(node, first_server=servers)
        servers += len(list((mirror_path(mirror_dir, node.host) / "log").glob("serverlog.*")))
        per_rank: Dict[int, List[LogBlock]] = {}
        for block in read_node(mirror_dir, node):
            kept = keep.block(block)
            if kept is not None:
                per_rank.setdefault(kept.rank, []).append(kept)
        for rank in sorted(per_rank):
            blocks = per_rank[rank]
            chosen.extend(blocks if tail is None else _last_lines(blocks, tail))
    return chosen


def parse_since(text: str, now: float) -> float:
    """``--since``: ``90s``, ``15m``, ``2h``, ``1d`` ago, or an epoch time."""
    from ..errors import ConfigError

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise ConfigError(f"--since {text!r} is not a duration",
                          fix="write it like 90s, 15m, 2h or 1d")
    value, unit = float(match.group(1)), match.group(2)
    if not unit and value > 10**9:
        return value
    return now - value * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


MAX_RANK = 1 << 20  # 64 hosts x 1024 processes is 65536 ranks


def parse_ranks(text: str) -> Set[int]:
    from ..errors import ConfigError

    ranks: Set[int] = set()
    for item in text.split(","):
        item = item.strip()
        bounds = item.split("-", 1)
        if not all(b.isdigit() for b in bounds):
            raise ConfigError(f"--rank {text!r}: {item!r} is not a rank or range",
                              fix="write ranks like 0,3 or 0-7")
        low, high = int(bounds[0]), int(bounds[-1])
        if low > high:
            raise ConfigError(f"--rank {text!r}: range {item!r} runs backwards",
                              fix=f"write it low-high, e.g. {high}-{low}")
        if high > MAX_RANK:  # a typo's extra digits must not build a set of billions
            raise ConfigError(f"--rank {text!r}: rank {high} is beyond any job's ranks",
                              fix="write ranks like 0,3 or 0-7")
        ranks.update(range(low, high + 1))
    return ranks
