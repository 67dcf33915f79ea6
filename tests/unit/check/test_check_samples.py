"""Probes built from facts recorded on the 4 hosts of a real lab
(data/check/facts-lab-h*.json), shared by the check's unit tests (no tests of its own)."""
import copy
import dataclasses
import json
from pathlib import Path
from typing import Dict, Optional

from multihost.check.judge import HostProbe, judge, make_survey, ping_matrix
from multihost.check.report import CheckReport
from multihost.hosts import Host
from multihost.job import JobOptions

DATA = Path(__file__).resolve().parents[1] / "data" / "check"
ADDRESSES = [f"198.18.0.{11 + i}" for i in range(4)]
PYTHON = "/opt/venv/bin/python"


def lab_facts(i: int) -> dict:
    return json.loads((DATA / f"facts-lab-h{i + 1}.json").read_text())


def lab_probes(n: int = 4, hosts=None) -> list:
    probes = []
    for i in range(n):
        host = hosts[i] if hosts else Host(ADDRESSES[i], rank=i, python=PYTHON,
                                           workdir="/root/work")
        facts = lab_facts(i)
        if n < 4:  # ping only the hosts that are in this smaller cluster
            facts["ping"]["rtt"] = {a: v for a, v in facts["ping"]["rtt"].items()
                                    if a in ADDRESSES[:n]}
        if i == 0:
            rendezvous = {"listening": True, "port": 17000, "error": None,
                          "accepted": [{"rank": r, "from": ADDRESSES[r]} for r in range(1, n)]}
        else:
            rendezvous = {"ok": True, "ms": 0.3, "source": ADDRESSES[i]}
        probes.append(HostProbe(host, ADDRESSES[i], reach={"rtt": 0.1, "method": "icmp"},
                                ssh_ms=20.0, facts=facts, clock_skew=0.01, clock_error=0.02,
                                rendezvous=rendezvous))
    return probes


def report_of(probes, job: JobOptions = JobOptions(), start_port: Optional[int] = 17000,
              auto: bool = False) -> CheckReport:
    cluster = make_survey(probes, job, start_port, ADDRESSES[0], auto)
    return CheckReport(judge(cluster), start_port, ADDRESSES[0], ping_matrix(cluster), auto)


def statuses(report: CheckReport, name: str) -> Dict[int, str]:
    return {h.host.rank: h.result(name).status for h in report.hosts}


def with_facts(probe: HostProbe, **changes) -> HostProbe:
    facts = copy.deepcopy(probe.facts)
    facts.update(changes)
    return dataclasses.replace(probe, facts=facts)
