"""The types every part of the preflight shares: what it observed, one host's raw facts
(``HostProbe``) and every host's with the job (``Survey``), and what a check says of a
host (``CheckResult``).

They sit below the check registry (whose judges take the first two and return the
third), judge.py (which builds them and runs the judges) and report.py (which gathers
the results), so that none of these has to reach up to another.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Optional, Tuple

from .parsers import Software
from ..errors import MultihostError
from ..hosts import Host
from ..job import JobOptions

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str                 # pass | warn | fail | skip
    detail: str                 # one line, the whole story
    fix: Optional[str] = None   # what to do, for warn and fail
    brief: str = ""             # a few words for a table cell; detail when empty

    @property
    def cell(self) -> str:
        return self.brief or self.detail


@dataclass(frozen=True)
class HostProbe:
    """Everything observed about one host, before judging."""

    host: Host
    address: Optional[str] = None          # what the other hosts (and ping) use
    local: bool = False                    # this machine, no ssh
    via: str = "ssh"                       # how the host was reached: "ssh", or "srun"
                                           # (a step of the Slurm job; ssh_ms: that step's)
    reach: Optional[dict] = None           # {"rtt", "method", "tcp"} or {"skip": why}
    ssh_ms: Optional[float] = None
    ssh_error: Optional[MultihostError] = None
    facts: Optional[dict] = None           # the helper's reply (remote/check/ops.gather)
    facts_error: Optional[MultihostError] = None
    clock_skew: Optional[float] = None     # seconds, remote minus controller
    clock_error: float = 0.0               # the measurement's own uncertainty
    rendezvous: Optional[dict] = None      # connect result, or the listener's report
    rendezvous_error: Optional[str] = None # why it was not tried
    data: Optional[CheckResult] = None     # from data.verify_data, when it exists
    budget: float = 8.0
    budgets: Dict[str, float] = field(default_factory=dict)  # probes given longer

    def fact(self, name: str) -> Optional[dict]:
        return (self.facts or {}).get(name)

    def budget_of(self, probe: Optional[str]) -> float:
        """The seconds the host gave ``probe`` before reporting it timed out."""
        return self.budgets.get(probe or "", self.budget)


@dataclass(frozen=True)
class Survey:
    """Every probe and the job: what cross-host checks compare against."""

    probes: Tuple[HostProbe, ...]
    job: JobOptions
    start_port: Optional[int]
    master_addr: Optional[str]
    auto_port: bool = False
    auto_note: str = ""
    software: Dict[int, Software] = field(default_factory=dict)
    # Runs with a record on this controller (run.records.run_ids()); None: not known,
    # every run is taken as this controller's.
    known_runs: Optional[FrozenSet[str]] = None
    # The hosts as the user gave them (``--ips=...``, ``--hostfile F``, ssh flags): what a
    # fix's command names so that, typed as shown, it reaches the same hosts (fixes.py).
    given: str = ""

    def label(self, rank: int) -> str:
        return self.probes[rank].host.label
