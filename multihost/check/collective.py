"""``check --collective``, the pure half: the sizes, the schedule of the link test, the
bandwidth arithmetic of nccl-tests, the records, and the verdict. Nothing here talks to
a host (``collective_run`` does); everything here is tested from recorded figures.

nccl-tests' convention: algbw = bytes / time; busbw = algbw x 2(n-1)/n for all_reduce
and algbw x (n-1)/n for all_gather (whose bytes are the whole gathered buffer), n the
number of ranks, so that busbw is comparable with the hardware's link speed whatever n.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError

DEFAULT_SIZES = "1K-256M"
SIZE_FACTOR = 4              # 1K, 4K, ... 256M: ten sizes
SLOW_SHARE = 0.70            # below this share of the median: a finding
BUSY_LOAD = 1.0              # load average per CPU above which a host counts as busy
OPS = ("all_reduce", "all_gather")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", re.I)


def parse_size(text: str) -> int:
    match = _SIZE.match(text)
    if not match or int(match.group(1)) <= 0:
        raise ConfigError(f"--collective-sizes: {text!r} is not a size",
                          fix="write sizes as 1K, 64M, 1G, e.g. --collective-sizes 1K-256M")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def parse_sizes(text: str = DEFAULT_SIZES) -> Tuple[int, ...]:
    """``1K-256M`` (growing by 4x) or a list ``1K,1M,64M``: sizes in bytes, growing."""
    if "-" in text and "," not in text:
        low, high = (parse_size(part) for part in text.split("-", 1))
        if low > high:
            raise ConfigError(f"--collective-sizes {text}: the range runs backwards",
                              fix="give the smaller size first, e.g. 1K-256M")
        sizes, size = [], low
        while size <= high:
            sizes.append(size)
            size *= SIZE_FACTOR
        return tuple(sizes)
    sizes = sorted({parse_size(part) for part in text.split(",") if part.strip()})
    if not sizes:
        raise ConfigError("--collective-sizes is empty", fix="e.g. --collective-sizes 1K-256M")
    return tuple(sizes)


def human_size(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}iB"
    return f"{n} B"


def round_robin(n: int) -> List[List[Optional[int]]]:
    """A round-robin tournament (the circle method): rounds[r][k] is host k's peer in
    round r, or None when it sits out (odd n). Every pair meets exactly once; within a
    round every host is in at most one pair. n-1 rounds for even n, n for odd n."""
    slots = list(range(n)) + ([None] if n % 2 else [])
    m = len(slots)
    rounds = []
    for _ in range(m - 1):
        peers: List[Optional[int]] = [None] * n
        for i in range(m // 2):
            a, b = slots[i], slots[m - 1 - i]
            if a is not None and b is not None:
                peers[a], peers[b] = b, a
        if any(p is not None for p in peers):
            rounds.append(peers)
        slots = [slots[0], slots[-1]] + slots[1:-1]
    return rounds


def bus_factor(op: str, ranks: int) -> float:
    if ranks <= 1:
        return 0.0
    return (2.0 if op == "all_reduce" else 1.0) * (ranks - 1) / ranks


@dataclass(frozen=True)
class SizeRow:
    op: str
    bytes: int
    seconds: float       # per operation, the slowest rank's
    iters: int
    ranks: int

    @property
    def algbw(self) -> float:
        """Bytes per second."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.op, self.ranks)


@dataclass(frozen=True)
class CollectiveRun:
    backend: str
    ranks: int
    torch: str
    rows: Tuple[SizeRow, ...]
    capped: Tuple[Tuple[str, int], ...] = ()     # (op, the size after which it stopped)
    error: Optional[str] = None                  # why the job gave no figures
    timings: Tuple[Tuple[str, float], ...] = ()  # the job's own: import, init, measure (s)

    def latency(self, op: str) -> Optional[SizeRow]:
        """The smallest size of ``op``: its time is the latency of small messages."""
        rows = [r for r in self.rows if r.op == op]
        return min(rows, key=lambda r: r.bytes) if rows else None


@dataclass(frozen=True)
class LinkMatrix:
    """Throughput from host i (row) to host j (column) in bit/s, in rank order; None
    where the test gave no figure. ``ifaces[i][j]``: the interface host i sent by."""

    labels: Tuple[str, ...]
    rates: Tuple[Tuple[Optional[float], ...], ...]
    ifaces: Tuple[Tuple[Optional[str], ...], ...]
    errors: Tuple[str, ...] = ()

    def host_median(self, k: int) -> Optional[float]:
        """The median of every test host k took part in, sending or receiving."""
        values = [v for j in range(len(self.labels)) if j != k
                  for v in (self.rates[k][j], self.rates[j][k]) if v is not None]
        return statistics.median(values) if values else None

    def best_of(self, again: "LinkMatrix") -> "LinkMatrix":
        """Each link's faster figure of two measurements: a link is slow only when it was
        slow both times (a busy moment on a host costs one test, not a finding). Errors
        are those of the second, which is what holds now."""
        def best(a: Optional[float], b: Optional[float]) -> Optional[float]:
            return b if a is None else a if b is None else max(a, b)
        rates = tuple(tuple(best(a, b) for a, b in zip(row, again_row))
                      for row, again_row in zip(self.rates, again.rates))
        ifaces = tuple(tuple(b or a for a, b in zip(row, again_row))
                       for row, again_row in zip(self.ifaces, again.ifaces))
        return LinkMatrix(self.labels, rates, ifaces, again.errors)


@dataclass(frozen=True)
class HostFacts:
    """What the verdict may blame: the interface the host's tests left by, the one
    NCCL/GLOO will use, its link speed, and its load."""

    iface_used: Optional[str] = None
    iface_job: Optional[str] = None
    speed_mbit: Optional[int] = None
    load: Optional[float] = None
    cpus: Optional[int] = None


@dataclass(frozen=True)
class Finding:
    label: str
    rank: Optional[int]          # the host; None for a link between two hosts
    measured: float              # bit/s
    median: float
    cause: str
    fix: str

    @property
    def line(self) -> str:
        share = self.measured / self.median if self.median else 0.0
        return (f"{self.label}: link throughput {mbit(self.measured)}, {share:.0%} of the "
                f"median {mbit(self.median)}; likely cause: {self.cause}")


@dataclass(frozen=True)
class CollectiveReport:
    links: Optional[LinkMatrix]
    collective: Optional[CollectiveRun]
    findings: Tuple[Finding, ...]
    duration: float = 0.0
    skipped: Optional[str] = None    # why nothing was measured
    link_duration: float = 0.0       # of which the link test
    measured_twice: bool = False     # the links were tested again before a finding

    @property
    def ok(self) -> bool:
        """Everything was measured (a slow host or link is still ``ok``: see ready)."""
        return self.skipped is None and self.collective is not None and \
            self.collective.error is None

    @property
    def ready(self) -> bool:
        """Measured, and no host or link slow: what ``check --collective`` gates on."""
        return self.ok and not self.findings


def mbit(bits_per_s: float) -> str:
    return f"{bits_per_s / 1e6:.1f} Mbit/s"


def _cause(k: int, facts: Sequence[HostFacts]) -> Tuple[str, str]:
    """The likeliest cause of host k's slowness, from what the check knows, and the fix."""
    own = facts[k]
    others = [f for i, f in enumerate(facts) if i != k]
    if own.iface_used and own.iface_job and own.iface_used != own.iface_job:
        return (f"its tests left by {own.iface_used}, but NCCL/GLOO will use {own.iface_job}",
                f"set `iface = {own.iface_used}` for this host in the hostfile, or fix its "
                f"routes so the other hosts are reached by {own.iface_job}")
    speeds = [f.speed_mbit for f in others if f.speed_mbit]
    if own.speed_mbit and speeds and own.speed_mbit < statistics.median(speeds):
        return (f"{own.iface_used or 'its interface'} runs at {own.speed_mbit} Mb/s, the "
                f"others at {statistics.median(speeds):.0f} Mb/s",
                f"check the cable and the switch port (`ethtool {own.iface_used or 'IFACE'}` "
                "on the host); renegotiate the link speed")
    loads = [f.load / f.cpus for f in others if f.load is not None and f.cpus]
    if own.load is not None and own.cpus and own.load / own.cpus > BUSY_LOAD and \
            (not loads or own.load / own.cpus > 1.5 * statistics.median(loads)):
        return (f"the host is under load (load average {own.load:.1f} on {own.cpus} CPUs)",
                "see what runs there (`top`) and stop it, or leave the host out")
    iface = own.iface_used or "IFACE"
    return ("not the interface, its speed or the host's load: a traffic shaper, a duplex "
            "mismatch or a congested switch port",
            f"on the host: `tc qdisc show dev {iface}`, `ethtool {iface}`; "
            "test the link with iperf3 against a healthy host")


def judge(links: LinkMatrix, facts: Sequence[HostFacts]) -> Tuple[Finding, ...]:
    """A host whose median throughput is below 70% of the median host is named, with
    its likely cause; then a link below 70% of the median of all tests whose two hosts
    are both healthy (a bad cable or switch port between them)."""
    n = len(links.labels)
    medians = [links.host_median(k) for k in range(n)]
    known = [m for m in medians if m is not None]
    if n < 2 or not known:
        return ()
    overall = statistics.median(known)
    findings = []
    slow = set()
    for k, value in enumerate(medians):
        if value is not None and value < SLOW_SHARE * overall:
            slow.add(k)
            cause, fix = _cause(k, facts)
            findings.append(Finding(links.labels[k], k, value, overall, cause, fix))
    flows = [v for row in links.rates for v in row if v is not None]
    typical = statistics.median(flows) if flows else 0.0
    for i in range(n):
        for j in range(i + 1, n):
            if i in slow or j in slow:
                continue
            pair = [v for v in (links.rates[i][j], links.rates[j][i]) if v is not None]
            if pair and min(pair) < SLOW_SHARE * typical:
                findings.append(Finding(
                    f"{links.labels[i]} <-> {links.labels[j]}", None, min(pair), typical,
                    "this one link: both hosts are fast with the others",
                    "check the cables and switch ports between these two hosts; test "
                    "the pair with iperf3"))
    return tuple(findings)


def finite(value: object) -> Optional[float]:
    """A host's number as a float, or None when it is not a finite non-negative one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def collective_to_json(report: CollectiveReport) -> Dict[str, object]:
    links = report.links
    run = report.collective
    return {
        "ok": report.ok,
        "ready": report.ready,
        "measured_twice": report.measured_twice,
        "skipped": report.skipped,
        "duration_s": round(report.duration, 3),
        "links_duration_s": round(report.link_duration, 3),
        "links": None if links is None else {
            "hosts": list(links.labels),
            "bits_per_s": [[None if v is None else round(v) for v in row] for row in links.rates],
            "ifaces": [list(row) for row in links.ifaces],
            "host_median_bits_per_s": [None if m is None else round(m) for m in
                                       (links.host_median(k) for k in range(len(links.labels)))],
            "errors": list(links.errors),
        },
        "collective": None if run is None else {
            "backend": run.backend, "ranks": run.ranks, "torch": run.torch, "error": run.error,
            "capped": {op: size for op, size in run.capped},
            "timings_s": {name: round(value, 3) for name, value in run.timings},
            "rows": [{"op": r.op, "bytes": r.bytes, "time_us": round(r.seconds * 1e6, 2),
                      "iters": r.iters, "algbw_GBps": round(r.algbw / 1e9, 6),
                      "busbw_GBps": round(r.busbw / 1e9, 6)} for r in run.rows],
        },
        "findings": [{"host": f.label, "rank": f.rank, "bits_per_s": round(f.measured),
                      "median_bits_per_s": round(f.median), "cause": f.cause, "fix": f.fix}
                     for f in report.findings],
    }
