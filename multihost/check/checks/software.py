"""What the job will run with: one machine per entry, the job's python and framework
(the same everywhere), and the GPUs it asks for."""
from __future__ import annotations

from typing import Optional, Sequence

from .. import fixes
from ..judge import Survey, HostProbe, groups, not_checked, same_machine
from ..parsers import Software, fold_ranges, parse_gpu_apps, parse_gpus
from .sharing import own_process
from ..registry import check
from ..report import FAIL, PASS, SKIP, WARN, CheckResult
from ...hosts import Host


@check("machine", order=30, probes=("hostname",), source=None, short="mach")
def judge_machine(probe: HostProbe, survey: Survey) -> Optional[CheckResult]:
    """Shown only for an entry that repeats a machine: its runs would collide on that
    machine's ports and run directory ("run already exists", "busy")."""
    original = same_machine(survey).get(probe.host.rank)
    if original is None:
        return None
    return CheckResult("machine", FAIL,
                       f"{probe.host.label} is the same machine as {original.host.label} "
                       f"(rank {original.host.rank}): one kernel, one network stack",
                       f"list each machine once: {fixes.add('--exclude', probe.host.label)} "
                       "(more processes there: --nproc_per_node)", "repeated")


# -- software -------------------------------------------------------------------------
# What must be the same on every host, and how to read it from a host's Software. Mixed
# versions fail the check: a job across them can hang in its first collective or
# exchange tensors of another layout, and that is what the preflight is there to stop.
SAME_EVERYWHERE = (("torch", lambda s: s.torch), ("paddle", lambda s: s.paddle),
                   ("CUDA", lambda s: s.torch_cuda or s.paddle_cuda), ("NCCL", lambda s: s.nccl),
                   ("Python", lambda s: ".".join(s.python.split(".")[:2])))
PIP_NAMES = {"torch": "torch", "paddle": "paddlepaddle"}
TORCH_INDEX = "https://download.pytorch.org/whl"


@check("software", order=40, probes=("python",), short="sw")
def judge_software(probe: HostProbe, survey: Survey) -> CheckResult:
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
        other = _other_python(probe, survey, _wanted(survey))
        fix = f"{other}, or " if other else ""
        return CheckResult("software", FAIL, f"{python}: {reply['error']}",
                           fix + "see what it says: " + fixes.run(
                               fixes.on_host(survey.given, probe.host, python, "-c", "pass")),
                           "broken")
    mine = survey.software.get(probe.host.rank)
    if mine is None:
        return CheckResult("software", SKIP, "not checked: the python probe did not answer",
                           brief="-")
    missing = _missing_framework(probe, mine, survey)
    if missing:
        return missing
    if not mine.torch and not mine.paddle:
        other = _other_python(probe, survey, {})
        return CheckResult("software", WARN, f"{mine.describe()}: neither torch nor paddle",
                           (f"{other}, or " if other else "") +
                           f"install the framework the job needs into {mine.executable}",
                           "no framework")
    reference = survey.software.get(0)
    for what, value in SAME_EVERYWHERE:
        values = {rank: value(sw) for rank, sw in survey.software.items()}
        if reference is not None and value(mine) != value(reference):
            return CheckResult("software", FAIL, f"{what} differs: {groups(values, survey)}; "
                                                 "mixed versions can hang or corrupt collectives",
                               _same_fix(probe, survey, what, mine, reference),
                               f"{what} differs")
    brief = f"torch {mine.torch}" if mine.torch else f"paddle {mine.paddle}"
    return CheckResult("software", PASS, mine.describe(), brief=brief)


def _wanted(survey: Survey) -> dict:
    """{framework: the version the first host has (None: any)} of what the job needs."""
    first = survey.software.get(0)
    return {name: getattr(first, name, None) if first else None
            for name in survey.job.frameworks}


def _other_python(probe: HostProbe, survey: Survey, wanted: dict) -> Optional[str]:
    """``add `--python P``` for an interpreter on this host (remote/check/python)
    that has every framework of ``wanted`` (at its version, when one is given); with no
    framework wanted, one that has torch or paddle."""
    for other in (probe.fact("python") or {}).get("others") or []:
        if not isinstance(other, dict) or not isinstance(other.get("python"), str):
            continue
        has = {name: other.get(name) for name in PIP_NAMES if other.get(name)}
        if wanted:
            if not all(name in has and (version is None or _same(has[name], version))
                       for name, version in wanted.items()):
                continue
        elif not has:
            continue
        what = ", ".join(f"{name} {version}" for name, version in has.items())
        return f"{fixes.add('--python', fixes.quoted(other['python']))} (it has {what})"
    return None


def _same(found: str, version: str) -> bool:
    """torch's version file says 2.3.1+cu121 where the probe parsed 2.3.1+cu121 too; a
    parsed '(unknown version)' matches nothing."""
    return found == version or found.split("+")[0] == version.split("+")[0] and \
        "+" not in version


def _install(probe: HostProbe, survey: Survey, framework: str, version: Optional[str],
             executable: str) -> str:
    """pip in the job's python on that host, from here: the first host's version; a
    build of torch's own index (+cpu, +cu121) from that index, as torch's docs say."""
    known = version and "(" not in version
    pin = f"=={version.split('+')[0]}" if known else ""
    index = []
    if known and framework == "torch" and "+" in version:   # +cpu, +cu121: torch's index
        index = ["--index-url", f"{TORCH_INDEX}/{version.split('+', 1)[1]}"]
    command = fixes.on_host(survey.given, probe.host, executable, "-m", "pip", "install",
                            f"{PIP_NAMES[framework]}{pin}", *index)
    return f"install {framework}{pin} there: {fixes.run(command)}"


def _missing_framework(probe: HostProbe, mine: Software,
                       survey: Survey) -> Optional[CheckResult]:
    """A framework other hosts have (or the job's launcher needs) and this one lacks."""
    needed = survey.job.frameworks
    for framework in ("torch", "paddle"):
        if getattr(mine, framework):
            continue
        present = {rank: getattr(sw, framework) for rank, sw in survey.software.items()
                   if getattr(sw, framework)}
        if present or framework in needed:
            where = f" ({groups(present, survey)})" if present else ""
            why = ", which the launcher needs" if framework in needed else ""
            version = next(iter(present.values()), None)
            other = _other_python(probe, survey, {framework: version})
            fix = (f"{other}, or " if other else "") + \
                _install(probe, survey, framework, version, mine.executable)
            if framework in needed:
                fix += f", or, for a job without {framework}, add `--launcher python`"
            return CheckResult(
                "software", FAIL, f"{mine.executable} has no {framework}{why}{where}", fix,
                f"no {framework}")
    return None


def _same_fix(probe: HostProbe, survey: Survey, what: str, mine: Software,
              reference: Software) -> str:
    """An interpreter here with the first host's versions, else the first host's
    framework installed into this one."""
    wanted = {name: getattr(reference, name) for name in PIP_NAMES if getattr(reference, name)}
    other = _other_python(probe, survey, wanted) if what in PIP_NAMES else None
    if what in PIP_NAMES and getattr(reference, what):
        install = _install(probe, survey, what, getattr(reference, what), mine.executable)
    else:
        install = (f"install the first host's {what} ({SAME_VALUE[what](reference)}) here, or "
                   "point --python at an interpreter that has it")
    return (f"{other}, or " if other else "") + install


SAME_VALUE = dict(SAME_EVERYWHERE)


# -- GPUs -----------------------------------------------------------------------------
@check("gpus", order=50, probes=("gpus", "python"), short="gpu", on_timeout=(
    "nvidia-smi did not answer within {s:g}s: a GPU or the driver may be hung",
    "check `dmesg` for Xid errors on the host; reset the GPU or reboot it"))
def judge_gpus(probe: HostProbe, survey: Survey) -> CheckResult:
    skipped = not_checked(probe, "gpus")
    if skipped:
        return skipped
    job, host = survey.job, probe.host
    want, nproc = job.gpus_for(host), job.nproc_for(host)
    facts = probe.fact("gpus") or {}
    cpus = probe.facts.get("cpus") or 0
    gpus = parse_gpus(facts.get("out", "")) if facts.get("code") == 0 else ()
    if not want:
        if cpus and nproc > cpus:
            return CheckResult("gpus", WARN, f"CPU job: {nproc} processes on {cpus} CPUs",
                               f"{fixes.add('--nproc_per_node', str(cpus))} (or fewer), or "
                               "they will contend",
                               f"CPU {nproc}>{cpus}")
        idle = f"; {len(gpus)} GPUs unused" if gpus else ""
        return CheckResult("gpus", PASS, f"CPU job: {nproc} process{'es' if nproc > 1 else ''} "
                                         f"on {cpus} CPUs{idle}", brief="CPU")
    asked = fold_ranges(want)
    problem = _driver_problem(facts, asked, _cpu_fix(survey, host))
    if problem:
        return problem
    have = {gpu.index: gpu for gpu in gpus}
    missing = [i for i in want if i not in have]
    if missing:
        found = f"{len(gpus)} ({fold_ranges(have)})" if gpus else "none"
        fix = (f"ask for GPUs this host has: {_gpus_fix(survey, sorted(have))}, or "
               if gpus else "") + _cpu_fix(survey, host)
        return CheckResult("gpus", FAIL, f"GPU {fold_ranges(missing)} requested; this host has {found}",
                           fix, f"{len(gpus)} GPUs")
    software = survey.software.get(host.rank)
    if software and software.torch and not software.torch_cuda and not software.paddle:
        return CheckResult("gpus", FAIL, f"torch {software.torch} is a CPU build, but the job "
                                         f"asks for GPUs {asked}",
                           f"install a CUDA build of torch into {software.executable}, or "
                           + _cpu_fix(survey, host), "CPU torch")
    chosen = [have[i] for i in want]
    model = chosen[0].name
    memory = f" ({chosen[0].memory_mib // 1024} GiB)" if chosen[0].memory_mib else ""
    text = f"GPUs {asked} of {len(gpus)}x {model}{memory}, driver {chosen[0].driver}"
    uuids = {gpu.uuid: gpu.index for gpu in chosen}
    apps = parse_gpu_apps(facts.get("apps", ""))
    busy = [app for app in apps if app.uuid in uuids]
    if busy:
        app = busy[0]
        used = f", {app.used_mib} MiB" if app.used_mib else ""
        taken = {a.uuid for a in apps}
        free = [gpu.index for gpu in gpus if gpu.uuid not in taken][:len(want)]
        kill = fixes.run(fixes.on_host(survey.given, host, "kill", str(app.pid)))
        other = f"pick free GPUs: {_gpus_fix(survey, free)}, or " if len(free) == len(want) \
            else ""
        # Another user's process is not ours to stop: wait for the GPUs instead.
        stop = f"stop it: {kill}" if own_process(probe, app.pid) else "wait for it: " + \
            fixes.add("--queue")
        return CheckResult("gpus", WARN, f"GPU {uuids[app.uuid]} is in use by pid {app.pid} "
                                         f"({app.name}{used}); {len(busy)} process(es) on the "
                                         "requested GPUs", f"{other}{stop}", "busy")
    if nproc > len(want):
        return CheckResult("gpus", WARN, f"{nproc} processes share {len(want)} GPUs: {text}",
                           f"one process per GPU: {fixes.add('--nproc_per_node', str(len(want)))}",
                           "shared")
    models = {p.host.rank: _model(p) for p in survey.probes if survey.job.gpus_for(p.host)}
    models = {r: m for r, m in models.items() if m}
    if len(set(models.values())) > 1 and models.get(host.rank) != models.get(0):
        return CheckResult("gpus", WARN, f"mixed GPU models: {groups(models, survey)}",
                           "the job runs at the pace of the slowest GPU; use one model if you can",
                           "mixed")
    return CheckResult("gpus", PASS, text, brief=f"{len(want)}x {model.replace('NVIDIA ', '')}")


def _driver_problem(facts: dict, asked: str, cpu: str) -> Optional[CheckResult]:
    """nvidia-smi missing, hung or failing, while the job asks for GPUs."""
    if facts.get("missing"):
        return CheckResult("gpus", FAIL, f"no nvidia-smi (no NVIDIA driver), but the job asks "
                                         f"for GPUs {asked}",
                           f"{cpu}, or install the NVIDIA driver", "no driver")
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


def _cpu_fix(survey: Survey, host: Host) -> str:
    """How to run the same job on CPU, said for where the GPUs were asked: --gpus (drop
    it), the controller's CUDA_VISIBLE_DEVICES (fleetrun's default: unset it), or the
    hostfile (--gpus none beats it); as many processes per host as GPUs were asked."""
    job = survey.job
    want = len(job.gpus_for(host))
    nproc = (f" and {fixes.add('--nproc_per_node', str(want))} for {want} CPU processes per "
             "host" if job.nproc_per_node is None and want > 1 else "")
    if job.gpus is None:
        return f"to run on CPU, {fixes.add('--gpus none')}{nproc}"
    if job.gpus_from == "CUDA_VISIBLE_DEVICES":
        return f"to run on CPU, {fixes.run('unset CUDA_VISIBLE_DEVICES')}{nproc}"
    return f"to run on CPU, {fixes.drop('--gpus')}{nproc}"


def _gpus_fix(survey: Survey, have: Sequence[int]) -> str:
    listed = ",".join(str(i) for i in have)
    if survey.job.gpus is not None and survey.job.gpus_from == "CUDA_VISIBLE_DEVICES":
        return fixes.run(f"export CUDA_VISIBLE_DEVICES={listed}")
    return fixes.add("--gpus", listed)


def _model(probe: HostProbe) -> Optional[str]:
    facts = probe.fact("gpus") or {}
    gpus = parse_gpus(facts.get("out", "")) if facts.get("code") == 0 else ()
    return gpus[0].name if gpus else None


