"""What the preflight found: small frozen records, computed by the checks (``judge``,
``checks/``) and rendered by ``views/check_view``. ``multihost run`` reads the same
report (ok, the start port, the interface of every host, the master address) before it
starts anything.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from .model import FAIL, PASS, SKIP, WARN, CheckResult
from .registry import order_of
from ..errors import CheckError, and_more
from ..hosts import Host

@dataclass(frozen=True)
class HostReport:
    host: Host
    results: Tuple[CheckResult, ...]
    iface: Optional[str] = None     # the interface that reaches the first host
    address: Optional[str] = None   # the address the other hosts use for this one

    @property
    def ok(self) -> bool:
        return all(r.status != FAIL for r in self.results)

    def result(self, name: str) -> Optional[CheckResult]:
        for result in self.results:
            if result.name == name:
                return result
        return None


@dataclass(frozen=True)
class PingMatrix:
    """Round trips from host i (row) to host j (column) in ms, in rank order. A cell is
    None when no echo came back; a row is None when host i could not be asked."""

    labels: Tuple[str, ...]
    rows: Tuple[Optional[Tuple[Optional[float], ...]], ...]

    def failed_pairs(self) -> List[Tuple[int, int]]:
        return [(i, j) for i, row in enumerate(self.rows) if row is not None
                for j, rtt in enumerate(row) if i != j and rtt is None]

    @property
    def ok(self) -> bool:
        return not self.failed_pairs()


@dataclass(frozen=True)
class CheckReport:
    hosts: Tuple[HostReport, ...]
    start_port: Optional[int]      # resolved (also for --start-port auto); None: none free
    master_addr: Optional[str]     # what the other hosts connect to on the first host
    ping_matrix: PingMatrix
    auto_port: bool = False
    duration: float = 0.0
    # The hosts (labels, in rank order) of each workdir that several hosts see as one
    # directory (sync/shared.py): written once by the first, by every sync.
    shared: Tuple[Tuple[str, ...], ...] = ()

    @property
    def ok(self) -> bool:
        return all(host.ok for host in self.hosts) and self.start_port is not None

    def failures(self, status: str = FAIL) -> List[Tuple[HostReport, CheckResult]]:
        """Every result with that status, the most basic check first (then node rank):
        a host that cannot be reached is the cause; the others' failed pings to it are
        consequences, so the one error a run raises names the dead host."""
        found = [(h, r) for h in self.hosts for r in h.results if r.status == status]
        return sorted(found, key=lambda pair: order_of(pair[1].name))

    def iface_for(self, host: Union[Host, int, str]) -> Optional[str]:
        report = self.host_report(host)
        return report.iface if report else None

    def host_report(self, host: Union[Host, int, str]) -> Optional[HostReport]:
        for report in self.hosts:
            if host in (report.host, report.host.rank, report.host.label, report.host.name):
                return report
        return None

    def error(self) -> Optional[CheckError]:
        """One CheckError naming the first failure (and how many more), or None: what
        ``run`` raises when the preflight says no."""
        failures = self.failures()
        if not failures:
            if self.start_port is None:
                return CheckError("no free port range in 10000-20000 on every host",
                                  fix="free some ports, or give --start-port")
            return None
        host, result = failures[0]
        more = and_more(named_failures(failures[1:]), count=len(failures) - 1)
        return CheckError(f"{result.name}: {result.detail}{more}", host=host.host.label,
                          fix=result.fix)

    def to_json(self) -> Dict[str, object]:
        return {
            "ok": self.ok,
            "start_port": self.start_port,
            "auto_port": self.auto_port,
            "master_addr": self.master_addr,
            "duration_s": round(self.duration, 3),
            "shared_workdirs": [{"hosts": list(group), "writer": group[0]}
                                for group in self.shared],
            "hosts": [{
                "rank": h.host.rank,
                "host": h.host.label,
                "address": h.address,
                "iface": h.iface,
                "ok": h.ok,
                "checks": [{"name": r.name, "status": r.status, "detail": r.detail,
                            "fix": r.fix} for r in h.results],
            } for h in self.hosts],
            "ping_matrix": {
                "hosts": list(self.ping_matrix.labels),
                "rtt_ms": [None if row is None else
                           [None if v is None else round(v, 3) for v in row]
                           for row in self.ping_matrix.rows],
            },
        }


def named_failures(failures) -> List[str]:
    """(host report, result) pairs as ``ping on h[2-3]``: one per check, its hosts folded,
    in the order they came."""
    from ..nodeset import fold

    hosts: Dict[str, List[str]] = {}
    for host, result in failures:
        hosts.setdefault(result.name, []).append(host.host.label)
    return [f"{name} on {fold(labels)}" for name, labels in hosts.items()]
