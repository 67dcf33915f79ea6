"""What the job will run with: one machine per entry, the job's python and framework
(the same everywhere), and the GPUs it asks for."""
from __future__ import annotations

from typing import Optional

from ..judge import Cluster, HostProbe, groups, not_checked, same_machine
from ..parsers import Software, fold_ranges, parse_gpu_apps, parse_gpus
from ..registry import check
from ..report import FAIL, PASS, SKIP, WARN, CheckResult


@check("machine", order=30, probes=("hostname",), source=None, short="mach")
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


@check("software", order=40, probes=("python",), short="sw")
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


# -- GPUs -----------------------------------------------------------------------------
@check("gpus", order=50, probes=("gpus", "python"), short="gpu", on_timeout=(
    "nvidia-smi did not answer within {s:g}s: a GPU or the driver may be hung",
    "check `dmesg` for Xid errors on the host; reset the GPU or reboot it"))
def judge_gpus(probe: HostProbe, cluster: Cluster) -> CheckResult:
    skipped = not_checked(probe, "gpus")
    if skipped:
        return skipped
    job, host = cluster.job, probe.host
    want, nproc = job.gpus_for(host), job.nproc_for(host)
    facts = probe.fact("gpus") or {}
    cpus = probe.facts.get("cpus") or 0
    gpus = parse_gpus(facts.get("out", "")) if facts.get("code") == 0 else ()
    if not want:
        if cpus and nproc > cpus:
            return CheckResult("gpus", WARN, f"CPU job: {nproc} processes on {cpus} CPUs",
                               f"use --nproc_per_node {cpus} or fewer, or they will contend",
                               f"CPU {nproc}>{cpus}")
        idle = f"; {len(gpus)} GPUs unused" if gpus else ""
        return CheckResult("gpus", PASS, f"CPU job: {nproc} process{'es' if nproc > 1 else ''} "
                                         f"on {cpus} CPUs{idle}", brief="CPU")
    asked = fold_ranges(want)
    problem = _driver_problem(facts, asked)
    if problem:
        return problem
    have = {gpu.index: gpu for gpu in gpus}
    missing = [i for i in want if i not in have]
    if missing:
        found = f"{len(gpus)} ({fold_ranges(have)})" if gpus else "none"
        return CheckResult("gpus", FAIL, f"GPU {fold_ranges(missing)} requested; this host has {found}",
                           "list only GPUs this host has: gpus = in its hostfile section, or --gpus",
                           f"{len(gpus)} GPUs")
    software = cluster.software.get(host.rank)
    if software and software.torch and not software.torch_cuda and not software.paddle:
        return CheckResult("gpus", FAIL, f"torch {software.torch} is a CPU build, but the job "
                                         f"asks for GPUs {asked}",
                           f"install a CUDA build of torch into {software.executable}", "CPU torch")
    chosen = [have[i] for i in want]
    model = chosen[0].name
    memory = f" ({chosen[0].memory_mib // 1024} GiB)" if chosen[0].memory_mib else ""
    text = f"GPUs {asked} of {len(gpus)}x {model}{memory}, driver {chosen[0].driver}"
    uuids = {gpu.uuid: gpu.index for gpu in chosen}
    busy = [app for app in parse_gpu_apps(facts.get("apps", "")) if app.uuid in uuids]
    if busy:
        app = busy[0]
        used = f", {app.used_mib} MiB" if app.used_mib else ""
        return CheckResult("gpus", WARN, f"GPU {uuids[app.uuid]} is in use by pid {app.pid} "
                                         f"({app.name}{used}); {len(busy)} process(es) on the "
                                         "requested GPUs", "stop them, or pick other GPUs with --gpus",
                           "busy")
    if nproc > len(want):
        return CheckResult("gpus", WARN, f"{nproc} processes share {len(want)} GPUs: {text}",
                           "give --nproc_per_node equal to the number of GPUs", "shared")
    models = {p.host.rank: _model(p) for p in cluster.probes if cluster.job.gpus_for(p.host)}
    models = {r: m for r, m in models.items() if m}
    if len(set(models.values())) > 1 and models.get(host.rank) != models.get(0):
        return CheckResult("gpus", WARN, f"mixed GPU models: {groups(models, cluster)}",
                           "the job runs at the pace of the slowest GPU; use one model if you can",
                           "mixed")
    return CheckResult("gpus", PASS, text, brief=f"{len(want)}x {model.replace('NVIDIA ', '')}")


def _driver_problem(facts: dict, asked: str) -> Optional[CheckResult]:
    """nvidia-smi missing, hung or failing, while the job asks for GPUs."""
    if facts.get("missing"):
        return CheckResult("gpus", FAIL, f"no nvidia-smi (no NVIDIA driver), but the job asks "
                                         f"for GPUs {asked}",
                           "install the NVIDIA driver, or run on CPU (no --gpus; gpus = none)",
                           "no driver")
    if facts.get("timeout"):
        return CheckResult("gpus", FAIL, f"nvidia-smi did not answer within {facts['timeout']}s",
                           "a GPU or the driver may be hung: check `dmesg` for Xid errors, "
                           "reset the GPU or reboot", "timeout")
    if facts.get("code") != 0:
        said = (facts.get("err") or facts.get("out") or "").strip().splitlines()
        last = said[-1] if said else f"exit {facts.get('code')}"
        return CheckResult("gpus", FAIL, f"nvidia-smi failed: {last}",
                           "check the NVIDIA driver: run nvidia-smi on the host", "driver error")
    return None


def _model(probe: HostProbe) -> Optional[str]:
    facts = probe.fact("gpus") or {}
    gpus = parse_gpus(facts.get("out", "")) if facts.get("code") == 0 else ()
    return gpus[0].name if gpus else None


