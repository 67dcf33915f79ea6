"""The host itself: can the controller reach it and log in, is there room in the
workdir, does its clock agree, do earlier runs linger there, is the data there."""
from __future__ import annotations

from typing import Optional

from .. import fixes
from ..judge import Survey, HostProbe, not_checked
from ..parsers import gib
from ..registry import check
from ..report import FAIL, PASS, SKIP, WARN, CheckResult
from ...errors import ConnectError, and_more

MIN_FREE_DISK = 1 * 2 ** 30       # below this the sync itself may fail: fail
LOW_FREE_DISK = 10 * 2 ** 30      # checkpoints and logs grow: warn
MAX_CLOCK_SKEW = 1.0              # seconds; log times across hosts stop lining up


@check("reach", order=10, short="rch")
def judge_reach(probe: HostProbe, survey: Survey) -> CheckResult:
    """An ICMP echo from the controller, else a knock on the ssh port (see preflight)."""
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


@check("ssh", order=20)
def judge_ssh(probe: HostProbe, survey: Survey) -> CheckResult:
    if probe.local:
        return CheckResult("ssh", PASS, "this machine: no ssh needed", brief="local")
    error = probe.ssh_error
    ms = f" in {probe.ssh_ms:.0f} ms" if probe.ssh_ms is not None else ""
    if probe.via == "srun":   # a step of the Slurm job: srun's words, Slurm's fixes
        if error is None:
            return CheckResult("ssh", PASS, f"srun step{ms}", brief="srun")
        brief = "job ended" if getattr(error, "kind", "") == ConnectError.LOST else "srun failed"
        return CheckResult("ssh", FAIL, error.cause, error.fix, brief)
    if error is None:
        return CheckResult("ssh", PASS, f"password-free login{ms}", brief="ok")
    kind = getattr(error, "kind", "error")
    brief = {ConnectError.AUTH: "key refused", ConnectError.TIMEOUT: "timeout",
             ConnectError.REFUSED: "refused", ConnectError.NAME: "bad name",
             ConnectError.HOSTKEY_UNKNOWN: "unknown key",
             ConnectError.HOSTKEY_CHANGED: "KEY CHANGED",
             ConnectError.HOSTKEY_REVOKED: "KEY REVOKED"}.get(kind, "failed")
    return CheckResult("ssh", FAIL, error.cause, error.fix, brief)


@check("disk", order=100, probes=("disk",), on_timeout=(
    "the workdir's filesystem did not answer within {s:g}s (a hung network mount?)",
    "check the mount behind the workdir (`df` hangs too?), or pick another --workdir"))
def judge_disk(probe: HostProbe, survey: Survey) -> CheckResult:
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


@check("clock", order=110, short="clk")
def judge_clock(probe: HostProbe, survey: Survey) -> CheckResult:
    """Measured from the helper's reply (see rounds._store), no probe of its own."""
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
                           "enable NTP on every host: " + fixes.run(fixes.multihost(
                               "exec", survey.given, "--", "timedatectl", "set-ntp", "true")),
                           f"{skew:+.1f} s")
    return CheckResult("clock", PASS, text, brief="ok")


@check("leftovers", order=120, probes=("leftovers",), short="left")
def judge_leftovers(probe: HostProbe, survey: Survey) -> CheckResult:
    """This user's processes of earlier runs (the host reports no other user's). A run
    this controller has no record of is said to be so: `multihost stop` here can not
    find its hosts."""
    skipped = not_checked(probe, "leftovers")
    if skipped:
        return skipped
    # A run that still holds the host is not left over: the busy check names it.
    live = {e.get("run_id") for e in (probe.fact("holds") or {}).get("entries") or ()
            if e.get("live")}
    runs = [r for r in probe.fact("leftovers") or [] if r.get("run_id") not in live]
    if not runs:
        return CheckResult("leftovers", PASS, "no processes of earlier runs", brief="none")
    run = runs[0]
    run_id, pids = run["run_id"], run.get("pids", [])
    count = f"{len(pids)} process{'es' if len(pids) != 1 else ''}"
    more = and_more([str(r.get("run_id")) for r in runs[1:]], 2,
                    unit="runs" if len(runs) > 2 else "run")
    pgid = run.get("pgid")
    kill = ["kill", "-TERM", "--", f"-{pgid}"] if pgid else ["kill", *map(str, pids[:5])]
    on_host = fixes.run(fixes.on_host(survey.given, probe.host, *kill))
    where = f"pid {pids[0]}: {run.get('command', '?')}"
    if survey.known_runs is not None and run_id not in survey.known_runs:
        return CheckResult(
            "leftovers", FAIL,
            f"run {run_id}, not started from this controller, still has {count} here "
            f"({where}){more}",
            f"stop it here: {on_host}, or `multihost stop {run_id}` on the controller that "
            "started it", f"run {run_id}")
    return CheckResult(
        "leftovers", FAIL, f"run {run_id} still has {count} here ({where}){more}",
        f"stop it: {fixes.run(f'multihost stop {run_id}')}, or {on_host}", f"run {run_id}")


@check("data", order=130, probes=("data",), wanted=lambda job, host: bool(job.data or host.data))
def judge_data(probe: HostProbe, survey: Survey) -> Optional[CheckResult]:
    """Only with --data (or data = in the hostfile): the verification's verdict (see
    data_check) where it ran, else whether the paths exist."""
    paths = tuple(dict.fromkeys(tuple(survey.job.data) + tuple(probe.host.data)))
    if not paths:
        return None
    if probe.data is not None:
        return probe.data
    skipped = not_checked(probe, "data")
    if skipped:
        return skipped
    found = probe.fact("data") or {}
    missing = [p for p in paths if not (found.get(p) or {}).get("exists")]
    if missing:
        return CheckResult("data", FAIL, f"{', '.join(missing)} missing here",
                           "copy the dataset to the same path on every host (rsync -a), or "
                           "mount the shared storage there", "missing")
    return CheckResult("data", PASS, f"{', '.join(paths)} present (contents not compared)",
                       brief="present")
