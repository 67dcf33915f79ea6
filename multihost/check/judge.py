"""Judging the facts: raw observations of every host (``HostProbe``) become pass, warn,
fail or skip for each check, with a one-line detail and a fix.

Pure: no host, no network, no clock. Checks that compare hosts (software versions,
interface names, GPU models) see every host at once through ``Cluster``. Host-level
checks live here; the checks of the job's own needs (GPUs, ports, rendezvous, data)
live in ``check_job``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

from .parsers import Software, gib
from .report import FAIL, PASS, SKIP, WARN, CheckResult
from ..errors import ConnectError, MultihostError
from ..hosts import Host
from ..job import JobOptions
from ..nodeset import fold

MIN_FREE_DISK = 1 * 2 ** 30       # below this the sync itself may fail: fail
LOW_FREE_DISK = 10 * 2 ** 30      # checkpoints and logs grow: warn
MAX_CLOCK_SKEW = 1.0              # seconds; log times across hosts stop lining up

# Which remote probe feeds which check (a probe that timed out fails its check).
PROBE_OF = {"software": "python", "gpus": "gpus", "ports": "ports", "rendezvous": "connect",
            "ping": "ping", "iface": "net", "disk": "disk", "leftovers": "leftovers",
            "data": "data"}
TIMEOUT_MEANING = {
    "disk": ("the workdir's filesystem did not answer within {s:g}s (a hung network mount?)",
             "check the mount behind the workdir (`df` hangs too?), or pick another --workdir"),
    "gpus": ("nvidia-smi did not answer within {s:g}s: a GPU or the driver may be hung",
             "check `dmesg` for Xid errors on the host; reset the GPU or reboot it"),
}


@dataclass(frozen=True)
class HostProbe:
    """Everything observed about one host, before judging."""

    host: Host
    address: Optional[str] = None          # what the other hosts (and ping) use
    local: bool = False                    # this machine, no ssh
    reach: Optional[dict] = None           # {"rtt", "method", "tcp"} or {"skip": why}
    ssh_ms: Optional[float] = None
    ssh_error: Optional[MultihostError] = None
    facts: Optional[dict] = None           # the helper's reply (remote/ops_check.gather)
    facts_error: Optional[MultihostError] = None
    clock_skew: Optional[float] = None     # seconds, remote minus controller
    clock_error: float = 0.0               # the measurement's own uncertainty
    rendezvous: Optional[dict] = None      # connect result, or the listener's report
    rendezvous_error: Optional[str] = None # why it was not tried
    data: Optional[CheckResult] = None     # from data.verify_data, when it exists
    budget: float = 8.0

    def fact(self, name: str) -> Optional[dict]:
        return (self.facts or {}).get(name)


@dataclass(frozen=True)
class Cluster:
    """Every probe and the job: what cross-host checks compare against."""

    probes: Tuple[HostProbe, ...]
    job: JobOptions
    start_port: Optional[int]
    master_addr: Optional[str]
    auto_port: bool = False
    auto_note: str = ""
    software: Dict[int, Software] = field(default_factory=dict)
    # Runs with a record on this controller (runs.run_ids()); None: not known, every run
    # is taken as this controller's.
    known_runs: Optional[FrozenSet[str]] = None

    def label(self, rank: int) -> str:
        return self.probes[rank].host.label


def not_checked(probe: HostProbe, name: str) -> Optional[CheckResult]:
    """SKIP (the host could not be asked) or FAIL (the probe hung), else None."""
    if probe.ssh_error is not None:
        return CheckResult(name, SKIP, "not checked: no ssh session", brief="-")
    if probe.facts is None:
        why = probe.facts_error.cause if probe.facts_error else "no answer"
        return CheckResult(name, SKIP, f"not checked: the helper failed ({why})", brief="-")
    source = PROBE_OF.get(name)
    if source in probe.facts.get("timed_out", []):
        detail, fix = TIMEOUT_MEANING.get(name, (
            "did not finish within {s:g}s", "run `multihost check` again; if it repeats, "
            "look at the host's load"))
        return CheckResult(name, FAIL, detail.format(s=probe.budget), fix, brief="timeout")
    error = probe.facts.get("errors", {}).get(source)
    if error:
        return CheckResult(name, WARN, f"could not check: {error}",
                           "this is a bug in multihost's checks; please report it", "error")
    return None


def folded(labels: Sequence[str]) -> str:
    return fold(list(labels))


def groups(values: Dict[int, Optional[str]], cluster: Cluster) -> str:
    """'2.13.0 on 198.18.0.[11-12], 2.12.1 on 198.18.0.13' in rank order of first sight."""
    by_value: Dict[str, List[str]] = {}
    for rank, value in sorted(values.items()):
        by_value.setdefault(value or "none", []).append(cluster.label(rank))
    return ", ".join(f"{value} on {folded(labels)}" for value, labels in by_value.items())


# -- reach and ssh --------------------------------------------------------------------
def judge_reach(probe: HostProbe) -> CheckResult:
    if probe.local:
        return CheckResult("reach", PASS, "this machine", brief="local")
    reach = probe.reach or {}
    if reach.get("skip"):
        return CheckResult("reach", SKIP, reach["skip"], brief="-")
    rtt, method, tcp = reach.get("rtt"), reach.get("method"), reach.get("tcp") or {}
    port = probe.host.port or 22
    if rtt is not None:
        return CheckResult("reach", PASS, f"ping {rtt:.2f} ms", brief="ok")
    why = ("ICMP is not permitted on this controller" if method is None
           else "no reply to ping (ICMP filtered?)")
    if "ms" in tcp:
        return CheckResult("reach", PASS, f"tcp/{port} answers in {tcp['ms']:.2f} ms ({why})",
                           brief="tcp ok")
    if tcp.get("error") == "refused":
        return CheckResult("reach", PASS, f"host is up: tcp/{port} refused ({why})",
                           brief="up")
    if method is None and not tcp:
        return CheckResult("reach", SKIP, why, brief="-")
    return CheckResult("reach", FAIL,
                       f"no reply to ping, and tcp/{port} {tcp.get('error', 'did not answer')}",
                       "check that the host is powered on and on the network: "
                       f"`ping {probe.address}` from the controller", "down")


def judge_ssh(probe: HostProbe) -> CheckResult:
    if probe.local:
        return CheckResult("ssh", PASS, "this machine: no ssh needed", brief="local")
    error = probe.ssh_error
    if error is None:
        ms = f" in {probe.ssh_ms:.0f} ms" if probe.ssh_ms is not None else ""
        return CheckResult("ssh", PASS, f"password-free login{ms}", brief="ok")
    kind = getattr(error, "kind", "error")
    brief = {ConnectError.AUTH: "key refused", ConnectError.TIMEOUT: "timeout",
             ConnectError.REFUSED: "refused", ConnectError.NAME: "bad name",
             ConnectError.HOSTKEY_UNKNOWN: "unknown key",
             ConnectError.HOSTKEY_CHANGED: "KEY CHANGED",
             ConnectError.HOSTKEY_REVOKED: "KEY REVOKED"}.get(kind, "failed")
    return CheckResult("ssh", FAIL, error.cause, error.fix, brief)


# -- the same machine twice ----------------------------------------------------------
def same_machine(cluster: Cluster) -> Dict[int, HostProbe]:
    """{rank: the first entry on the same machine} for every later entry that reaches a
    machine already listed (its boot id and network namespace, see remote/ops_check)."""
    first: Dict[str, HostProbe] = {}
    repeats: Dict[int, HostProbe] = {}
    for probe in cluster.probes:
        identity = (probe.fact("hostname") or {}).get("machine") if probe.facts else None
        if not identity:
            continue
        if identity in first:
            repeats[probe.host.rank] = first[identity]
        else:
            first[identity] = probe
    return repeats


def judge_machine(probe: HostProbe, cluster: Cluster) -> Optional[CheckResult]:
    """Shown only for an entry that repeats a machine: its runs would collide on that
    machine's ports and run directory ("run already exists", "busy")."""
    original = same_machine(cluster).get(probe.host.rank)
    if original is None:
        return None
    return CheckResult("machine", FAIL,
                       f"{probe.host.label} is the same machine as {original.host.label} "
                       f"(rank {original.host.rank}): one kernel, one network stack",
                       f"list each machine once: drop {probe.host.label} from --ips or the "
                       "hostfile (more processes there: --nproc_per_node)", "repeated")


# -- software -------------------------------------------------------------------------
# What must be the same on every host, and how to read it from a host's Software.
SAME_EVERYWHERE = (("torch", lambda s: s.torch), ("paddle", lambda s: s.paddle),
                   ("CUDA", lambda s: s.torch_cuda or s.paddle_cuda), ("NCCL", lambda s: s.nccl),
                   ("Python", lambda s: ".".join(s.python.split(".")[:2])))


def judge_software(probe: HostProbe, cluster: Cluster) -> CheckResult:
    python = probe.host.python
    if probe.facts is None and probe.facts_error is not None and probe.ssh_error is None:
        # The helper itself could not run: most often the interpreter is not there.
        return CheckResult("software", FAIL, probe.facts_error.cause,
                           probe.facts_error.fix or f"check that {python} runs on the host",
                           "no python")
    skipped = not_checked(probe, "software")
    if skipped:
        return skipped
    reply = probe.fact("python") or {}
    if reply.get("error"):
        return CheckResult("software", FAIL, f"{python}: {reply['error']}",
                           f"run `{python} -c pass` on the host and fix what it says", "broken")
    mine = cluster.software.get(probe.host.rank)
    if mine is None:
        return CheckResult("software", SKIP, "not checked: the python probe did not answer",
                           brief="-")
    missing = _missing_framework(mine, cluster)
    if missing:
        return missing
    if not mine.torch and not mine.paddle:
        return CheckResult("software", WARN, f"{mine.describe()}: neither torch nor paddle",
                           f"install the framework the job needs into {mine.executable}, "
                           "or point --python at the interpreter that has it", "no framework")
    reference = cluster.software.get(0)
    for what, value in SAME_EVERYWHERE:
        values = {rank: value(sw) for rank, sw in cluster.software.items()}
        if reference is not None and value(mine) != value(reference):
            return CheckResult("software", WARN, f"{what} differs: {groups(values, cluster)}",
                               f"install the same {what} on every host; mixed versions can "
                               "hang or corrupt collectives", f"{what} differs")
    brief = f"torch {mine.torch}" if mine.torch else f"paddle {mine.paddle}"
    return CheckResult("software", PASS, mine.describe(), brief=brief)


def _missing_framework(mine: Software, cluster: Cluster) -> Optional[CheckResult]:
    """A framework other hosts have (or the job's launcher needs) and this one lacks."""
    needed = cluster.job.frameworks
    for framework in ("torch", "paddle"):
        if getattr(mine, framework):
            continue
        present = {rank: getattr(sw, framework) for rank, sw in cluster.software.items()
                   if getattr(sw, framework)}
        if present or framework in needed:
            where = f" ({groups(present, cluster)})" if present else ""
            why = ", which the launcher needs" if framework in needed else ""
            version = next(iter(present.values()), None)
            pin = f"=={version}" if version and "(" not in version else ""
            fix = (f"install {framework}{pin} into {mine.executable}, or point --python "
                   "(python = in the hostfile) at the interpreter that has it")
            if framework in needed:
                fix += f"; a job without {framework}: --launcher python"
            return CheckResult(
                "software", FAIL, f"{mine.executable} has no {framework}{why}{where}", fix,
                f"no {framework}")
    return None


# -- the host's own state -------------------------------------------------------------
def judge_disk(probe: HostProbe) -> CheckResult:
    skipped = not_checked(probe, "disk")
    if skipped:
        return skipped
    disk = probe.fact("disk") or {}
    path, free = disk.get("path", "?"), disk.get("free", 0)
    where = path if disk.get("exists") else f"{path} (to be created in {disk.get('existing')})"
    if not disk.get("writable"):
        return CheckResult("disk", FAIL, f"cannot write {disk.get('existing')} for the workdir",
                           "pick a writable --workdir, or fix its permissions", "read-only")
    text = f"{gib(free)} free in {where}"
    if free < MIN_FREE_DISK:
        return CheckResult("disk", FAIL, f"only {text}",
                           "free space there, or pick another --workdir", gib(free))
    if free < LOW_FREE_DISK:
        return CheckResult("disk", WARN, f"only {text}: checkpoints and logs may fill it",
                           "free space there, or pick another --workdir", gib(free))
    return CheckResult("disk", PASS, text, brief="ok")


def judge_clock(probe: HostProbe) -> CheckResult:
    skipped = not_checked(probe, "clock")
    if skipped:
        return skipped
    if probe.local:
        return CheckResult("clock", PASS, "this machine: the controller's own clock", brief="ok")
    skew = probe.clock_skew
    if skew is None:
        return CheckResult("clock", SKIP, "not measured", brief="-")
    text = f"{skew:+.2f} s against the controller (±{probe.clock_error:.2f} s)"
    if abs(skew) - probe.clock_error > MAX_CLOCK_SKEW:
        direction = "ahead of" if skew > 0 else "behind"
        return CheckResult("clock", WARN, f"clock {abs(skew):.1f} s {direction} the controller",
                           "enable NTP on every host (timedatectl set-ntp true, or chrony)",
                           f"{skew:+.1f} s")
    return CheckResult("clock", PASS, text, brief="ok")


def judge_leftovers(probe: HostProbe, cluster: Cluster) -> CheckResult:
    """This user's processes of earlier runs (the host reports no other user's). A run
    this controller has no record of is said to be so: `multihost stop` here can not
    find its hosts."""
    skipped = not_checked(probe, "leftovers")
    if skipped:
        return skipped
    runs = probe.fact("leftovers") or []
    if not runs:
        return CheckResult("leftovers", PASS, "no processes of earlier runs", brief="none")
    run = runs[0]
    run_id, pids = run["run_id"], run.get("pids", [])
    count = f"{len(pids)} process{'es' if len(pids) != 1 else ''}"
    more = f" (and {len(runs) - 1} more run{'s' if len(runs) > 2 else ''})" if len(runs) > 1 else ""
    pgid = run.get("pgid")
    kill = f"kill -TERM -- -{pgid}" if pgid else f"kill {' '.join(str(p) for p in pids[:5])}"
    where = f"pid {pids[0]}: {run.get('command', '?')}"
    if cluster.known_runs is not None and run_id not in cluster.known_runs:
        return CheckResult(
            "leftovers", FAIL,
            f"run {run_id}, not started from this controller, still has {count} here "
            f"({where}){more}",
            f"stop it from the controller that started it (multihost stop {run_id} there), "
            f"or `{kill}` on the host", f"run {run_id}")
    return CheckResult(
        "leftovers", FAIL, f"run {run_id} still has {count} here ({where}){more}",
        f"stop it: multihost stop {run_id} (or `{kill}` on the host)", f"run {run_id}")


HOST_JUDGES: Dict[str, Callable[[HostProbe], CheckResult]] = {
    "reach": judge_reach, "ssh": judge_ssh, "disk": judge_disk, "clock": judge_clock,
}
