"""Every preflight check is one record, registered by the judge that defines it:

    @check("disk", order=100, probes=("disk",), short="disk")
    def judge_disk(probe: HostProbe, survey: Survey) -> Optional[CheckResult]: ...

The record says what the check asks of each host (the names of host-side probes in
``remote/check/ops.PROBES``, gathered in the one helper call per host), what a timeout of
its probe means, and where its column stands in the report. The package's ``__init__``
imports every module of ``check/checks/``, so a check exists by being there, as
pyinfra's facts do: a new check is one file in that folder, and its test.

Judges are pure (no host, no network, no clock): they see one host's ``HostProbe`` and
the whole ``Survey`` (for checks that compare hosts), and return a ``CheckResult``, or
None when the check has nothing to say for that host (its column then appears only for
the hosts it concerns).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from .model import CheckResult, Survey, HostProbe
    from ..hosts import Host
    from ..job import JobOptions

    Judge = Callable[[HostProbe, Survey], Optional[CheckResult]]


@dataclass(frozen=True)
class Check:
    name: str                            # its column, and the name of its CheckResult
    order: int                           # columns left to right: can I reach it, log in,
                                         # is the software there, the job's needs, hygiene
    judge: "Judge"
    probes: Tuple[str, ...] = ()         # the host-side facts it reads
    source: Optional[str] = None         # the probe whose timeout or error is this check's
    short: str = ""                      # its header in the compact table
    on_timeout: Optional[Tuple[str, str]] = None  # (detail, fix) when ``source`` timed out;
                                                  # ``{s}`` is the budget in seconds
    wanted: Optional[Callable[["JobOptions", "Host"], bool]] = None  # asked only when true
    budget: float = 0.0                  # seconds its probes get at the least (see budgets)

    @property
    def header(self) -> str:
        return self.short or self.name


_CHECKS: Dict[str, Check] = {}


def check(name: str, order: int, *, probes: Tuple[str, ...] = (), source: Optional[str] = "",
          short: str = "", on_timeout: Optional[Tuple[str, str]] = None,
          wanted: Optional[Callable[["JobOptions", "Host"], bool]] = None, budget: float = 0.0):
    """Register the decorated judge as the check ``name``. ``source`` defaults to the
    first probe (None: no probe's timeout concerns it); ``budget``: the seconds its probes
    get when the check's budget is less. The judge is returned as it is."""
    def register(judge: "Judge") -> "Judge":
        known = _CHECKS.get(name)
        if known is not None and known.judge.__qualname__ != judge.__qualname__:
            raise ValueError(f"two checks named {name!r}: {known.judge.__module__} and "
                             f"{judge.__module__}")
        _CHECKS[name] = Check(name, order, judge, tuple(probes),
                              (probes[0] if probes else None) if source == "" else source,
                              short, on_timeout, wanted, budget)
        return judge
    return register


def checks() -> Tuple[Check, ...]:
    """Every check, in the order of the report's columns."""
    return tuple(sorted(_CHECKS.values(), key=lambda c: (c.order, c.name)))


def find(name: str) -> Optional[Check]:
    return _CHECKS.get(name)


def order_of(name: str) -> int:
    """A check's place among the columns (after every check when unknown)."""
    found = find(name)
    return found.order if found else 1 << 30


def probes_for(job: "JobOptions", host: "Host") -> List[str]:
    """The probes one host is asked for in the facts round, each once."""
    wanted: List[str] = []
    for record in checks():
        if record.wanted is None or record.wanted(job, host):
            wanted += [p for p in record.probes if p not in wanted]
    return wanted


def budgets_for(probes: List[str], budget: float) -> Dict[str, float]:
    """The probes among ``probes`` whose checks need more than ``budget``, each with its
    own: a probe that starts programs slow to start on a busy host (podman, a Go binary
    that opens its storage, takes seconds a command there) is not late at ``budget``."""
    longer: Dict[str, float] = {}
    for record in checks():
        for name in record.probes:
            if name in probes and record.budget > max(budget, longer.get(name, 0.0)):
                longer[name] = record.budget
    return longer
