"""The other users of a host: is it held by a run (anyone's, from any controller: the
host registry of remote/registry/holds.py), and does a training run there that multihost did not
start (a torchrun, paddle's launcher, a process on a GPU)?

A fix here never stops a live run that is not one's own: it waits (`--queue`), goes
elsewhere (`--exclude`, other GPUs), or, for one's own run, stops it.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .. import fixes
from ..judge import Survey, HostProbe, not_checked
from ..parsers import parse_gpus
from ..registry import check
from ..report import FAIL, PASS, WARN, CheckResult
from ...errors import and_more
from ...remote.registry.holds import fold_ints, holder_line, overlaps


def job_needs(probe: HostProbe, survey: Survey):
    """(GPUs or None for the whole host, ports) that the job takes on this host."""
    gpus = survey.job.gpus_for(probe.host) or None
    ports = survey.job.ports(survey.start_port, probe.host) if survey.start_port else ()
    return gpus, tuple(ports)


def holders(probe: HostProbe, survey: Survey) -> List[dict]:
    """The live runs, of anyone, that hold what the job needs on this host."""
    gpus, ports = job_needs(probe, survey)
    entries = (probe.fact("holds") or {}).get("entries") or []
    return [e for e in entries if e.get("kind") == "run" and e.get("live")
            and overlaps(e.get("gpus"), gpus, e.get("ports"), ports)]


def registry_trouble(probe: HostProbe) -> Optional[Tuple[str, str]]:
    """(what, fix) of the host registry's first trouble (one not root's, one over-full),
    cut to a line: the host's own words, another user's input among them."""
    found = (probe.fact("holds") or {}).get("trouble") or []
    first = found[0] if found and isinstance(found[0], dict) else None
    if first is None:
        return None
    return str(first.get("text") or "")[:300], str(first.get("fix") or "")[:300]


def _me(probe: HostProbe) -> Optional[int]:
    return ((probe.fact("holds") or {}).get("me") or {}).get("uid")


def _free_gpus(probe: HostProbe, taken: Sequence[int]) -> List[int]:
    facts = probe.fact("gpus") or {}
    have = [g.index for g in parse_gpus(facts.get("out", ""))] if facts.get("code") == 0 else []
    return [i for i in have if i not in set(taken)]


def elsewhere(probe: HostProbe, survey: Survey, taken: Sequence[int]) -> List[str]:
    """Other GPUs of this host when enough are free, and the other hosts."""
    ways = []
    want = survey.job.nproc_for(probe.host)
    free = _free_gpus(probe, taken)
    if survey.job.gpus_for(probe.host) and len(free) >= want:
        # Its ports are taken too: the check picks free ones.
        ways.append("use GPUs it leaves free: " + fixes.add("--gpus", fold_ints(free[:want]),
                                                            "--start-port", "auto"))
    if len(survey.probes) > 1:
        ways.append("leave this host out: " + fixes.add("--exclude", probe.host.label))
    return ways


def busy_fix(entry: dict, probe: HostProbe, survey: Survey) -> str:
    queue = "wait for it: " + fixes.add("--queue")
    handle = entry.get("name") or entry["run_id"]
    # A job without GPUs may share the host's CPUs, on ports of its own.
    beside = [] if survey.job.gpus_for(probe.host) else [
        "run beside it: `multihost run` with `--allow-concurrent --start-port auto`"]
    if entry.get("uid") == _me(probe):
        if survey.known_runs is None or entry["run_id"] in survey.known_runs:
            return ", or ".join([f"stop it: {fixes.run(f'multihost stop {handle}')}", queue])
        where = f" on {entry['controller']}" if entry.get("controller") else ""
        return ", or ".join([queue, f"if it is yours, stop it: `multihost stop {handle}`{where}"]
                            + beside)
    taken = [g for e in holders(probe, survey) for g in (e.get("gpus") or [])]
    return ", or ".join([queue] + elsewhere(probe, survey, taken) + beside
                        + [f"ask {entry['user']}"])


@check("busy", order=115, probes=("holds",), short="busy")
def judge_busy(probe: HostProbe, survey: Survey) -> Optional[CheckResult]:
    """A live run of anyone that holds the job's GPUs or ports here."""
    skipped = not_checked(probe, "busy")
    if skipped:
        return skipped
    found = holders(probe, survey)
    if not found:
        entries = (probe.fact("holds") or {}).get("entries") or []
        beside = [e for e in entries if e.get("kind") == "run" and e.get("live")]
        if beside:
            return CheckResult("busy", PASS, "free for this job; beside " + holder_line(beside[0]),
                               brief="shared")
        trouble = registry_trouble(probe)
        if trouble:   # free as far as anyone can tell here: the registry may hide runs
            return CheckResult("busy", WARN, "no run seen here, but " + trouble[0],
                               trouble[1], brief="registry?")
        return CheckResult("busy", PASS, "no run holds this host", brief="free")
    more = and_more([holder_line(e) for e in found[1:]], 2)
    first = found[0]
    # The check's name leads the line ("busy: alice's run ..."), as a run's refusal reads.
    return CheckResult("busy", FAIL, holder_line(first) + more,
                       busy_fix(first, probe, survey), f"{first['user']}'s")


def _held(entry: dict, probe: HostProbe, survey: Survey) -> Optional[str]:
    """What of the job's a foreign training holds here: its GPUs or ports, else None."""
    pids = {entry.get("pid")} | set(entry.get("tree") or ())
    gpus, ports = job_needs(probe, survey)
    taken = [b["port"] for b in (probe.fact("ports") or {}).get("busy", [])
             if b.get("pid") in pids and b.get("port") in ports]
    if taken:
        return f"port {taken[0]}"
    facts = probe.fact("gpus") or {}
    index = {g.uuid: g.index for g in parse_gpus(facts.get("out", ""))} if facts.get("out") else {}
    on = sorted(index[u] for u in entry.get("gpu_uuids") or () if u in index)
    if on and (gpus is None or set(on) & set(gpus)):
        return f"GPU {fold_ints(on)}"
    return None


@check("foreign", order=118, probes=("foreign", "holds"), short="other")
def judge_foreign(probe: HostProbe, survey: Survey) -> Optional[CheckResult]:
    """A training that multihost did not start: named; not ready when it holds the job's
    GPUs or ports, a warning otherwise."""
    if not_checked(probe, "foreign"):
        return None
    found = [e for e in probe.fact("foreign") or [] if isinstance(e, dict) and e.get("pid")]
    if not found:
        return None
    held = [(e, _held(e, probe, survey)) for e in found]
    entry, what = next(((e, w) for e, w in held if w), held[0])
    more = and_more([f"{e.get('user') or '?'}'s pid {e['pid']}" for e in found if e is not entry])
    who = f"{entry.get('user') or '?'}'s pid {entry['pid']} ({entry.get('command') or '?'})"
    detail = f"a training multihost did not start: {who}{more}"
    if entry.get("uid") is not None and entry.get("uid") == _me(probe):
        kill = fixes.run(fixes.on_host(survey.given, probe.host, "kill", str(entry["pid"])))
        ways = [f"if it is done with, stop it: {kill}"] + elsewhere(probe, survey, [])
    else:
        ways = elsewhere(probe, survey, []) + [f"ask {entry.get('user') or 'its owner'} "
                                                "when it will end"]
    if what:
        return CheckResult("foreign", FAIL, f"{detail} holds {what} of this job",
                           ", or ".join(ways), "held")
    return CheckResult("foreign", WARN, detail, ", or ".join(ways), f"{entry.get('user')}'s")


def own_process(probe: HostProbe, pid: int) -> bool:
    """Is ``pid`` this user's own (a fix may then stop it)? Unknown (no registry facts
    from this host): taken as one's own, as before there was a registry."""
    if probe.fact("holds") is None:
        return True
    me = _me(probe)
    for entry in probe.fact("foreign") or []:
        if isinstance(entry, dict) and pid in {entry.get("pid")} | set(entry.get("tree") or ()):
            return entry.get("uid") == me
    return False
