"""Judging the facts: raw observations of every host (``HostProbe``) become pass, warn,
fail or skip for each registered check (``registry``; the checks themselves are in
``checks/``), with a one-line detail and a fix.

Pure: no host, no network, no clock. Checks that compare hosts (software versions,
interface names, GPU models) see every host at once through ``Survey`` (model.py, with
``HostProbe``: below both the registry and the judge).
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .fixes import hosts_flags
from .parsers import parse_software
from .model import Survey, HostProbe
from .registry import checks, find
from .report import FAIL, SKIP, WARN, CheckResult, HostReport, PingMatrix
from .. import machines
from ..job import JobOptions
from ..nodeset import fold


def not_checked(probe: HostProbe, name: str) -> Optional[CheckResult]:
    """SKIP (the host could not be asked) or FAIL (the check's probe hung), else None."""
    if probe.ssh_error is not None:
        return CheckResult(name, SKIP, "not checked: no ssh session", brief="-")
    if probe.facts is None:
        why = probe.facts_error.cause if probe.facts_error else "no answer"
        return CheckResult(name, SKIP, f"not checked: the helper failed ({why})", brief="-")
    record = find(name)
    source = record.source if record else None
    if source in probe.facts.get("timed_out", []):
        detail, fix = (record.on_timeout if record and record.on_timeout else (
            "did not finish within {s:g}s", "check again (the same command); if it "
            "repeats, look at the host's load (uptime)"))
        return CheckResult(name, FAIL, detail.format(s=probe.budget_of(source)), fix, brief="timeout")
    error = probe.facts.get("errors", {}).get(source)
    if error:
        return CheckResult(name, WARN, f"could not check: {error}",
                           "this is a bug in multihost's checks; please report it", "error")
    return None


def folded(labels: Sequence[str]) -> str:
    return fold(list(labels))


def groups(values: Dict[int, Optional[str]], survey: Survey) -> str:
    """'2.13.0 on 198.18.0.[11-12], 2.12.1 on 198.18.0.13' in rank order of first sight."""
    by_value: Dict[str, List[str]] = {}
    for rank, value in sorted(values.items()):
        by_value.setdefault(value or "none", []).append(survey.label(rank))
    return ", ".join(f"{value} on {folded(labels)}" for value, labels in by_value.items())


def same_machine(survey: Survey) -> Dict[int, HostProbe]:
    """{rank: the first entry on the same machine} for every later entry that reaches a
    machine already listed (its boot id and network namespace, see remote/check/ops)."""
    probes = {probe.host.rank: probe for probe in survey.probes}
    identities = {rank: (probe.fact("hostname") or {}).get("machine") if probe.facts else None
                  for rank, probe in probes.items()}
    return {rank: probes[first] for rank, first in machines.repeats(identities).items()}


def route_iface(probe: HostProbe) -> Optional[str]:
    """The interface this host's route to the first host leaves by."""
    net = probe.fact("net") or {}
    return net.get("route_iface")


def ping_matrix(survey: Survey) -> PingMatrix:
    rows: List[Optional[Tuple[Optional[float], ...]]] = []
    for probe in survey.probes:
        ping = probe.fact("ping") if probe.facts else None
        if not ping or ping.get("method") is None:
            rows.append(None)
            continue
        rtt = ping.get("rtt", {})
        rows.append(tuple(0.0 if other.host.rank == probe.host.rank else rtt.get(other.address)
                          for other in survey.probes))
    return PingMatrix(tuple(p.host.label for p in survey.probes), tuple(rows))


def make_survey(probes: Sequence[HostProbe], job: JobOptions, start_port: Optional[int],
                master_addr: Optional[str], auto_port: bool = False,
                auto_note: str = "", known_runs: Optional[Iterable[str]] = None,
                given: Optional[str] = None) -> Survey:
    software = {p.host.rank: parse_software(p.fact("python")) for p in probes
                if p.fact("python") and not p.fact("python").get("error")}
    return Survey(tuple(probes), job, start_port, master_addr, auto_port, auto_note, software,
                  frozenset(known_runs) if known_runs is not None else None,
                  hosts_flags([p.host for p in probes]) if given is None else given)


def judge(survey: Survey) -> Tuple[HostReport, ...]:
    """Every registered check of every host, in rank order and in the checks' order."""
    reports = []
    for probe in survey.probes:
        results = [result for record in checks()
                   for result in (record.judge(probe, survey),) if result is not None]
        iface = probe.host.iface or route_iface(probe)
        reports.append(HostReport(probe.host, tuple(results), iface, probe.address))
    return tuple(reports)
