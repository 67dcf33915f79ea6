"""A Slurm lab (`multihost lab up N --slurm`): real slurmctld, slurmd and munged.

The controller becomes a machine of its own, `ctl` (198.18.0.1): a PID 1 from init.py in
the controller namespace with its own hostname (slurmctld refuses to start on a host
that is not its SlurmctldHost) and its own /run (munged's socket, the daemons' pid files
and slurmctld's state). It runs munged and slurmctld; every host runs munged and slurmd.
All of them read the lab's /etc/slurm and /etc/munge, bound in place, so nothing is
written to the machine's own /etc, /run or /var. `lab exec` runs in ctl's mounts and
hostname, so `salloc`/`srun` there talk to the lab's Slurm with its munge socket.

The config's lines are those a namespace needs (see cgroup_conf and slurm_conf); `lab
down` kills every daemon with its host's PID 1.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Sequence

from ..errors import LabError
from . import procs
from .config import CTL_ADDRESS, HOST_LOG_DIR, HOST_RUN_DIR, LabPaths, host_address, host_name

CTL_NAME = "ctl"
TOOLS = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "srun": "slurm-wlm",
         "munged": "munge"}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STATE_DIR = f"{HOST_RUN_DIR}/slurmctld"
SPOOL_DIR = f"{HOST_RUN_DIR}/slurmd"
PARTITION = "debug"
# Every daemon's output also lands in the host's log dir: a daemon that dies before it
# opens its own log file still says why.
START = (f"exec </dev/null >>{HOST_LOG_DIR}/daemons.log 2>&1; set -e; "
         "mkdir -p -m 0755 /run/munge; "
         f"munged --seed-file=/run/munge/munged.seed --log-file={HOST_LOG_DIR}/munged.log; ")


def hardware() -> Dict[str, int]:
    """This machine's CPUs as `slurmd -C` reports them: every lab host is this machine,
    and a NodeName line that differs from the hardware is logged as an error."""
    found: Dict[str, int] = {}
    try:
        out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30,
                             env={"PATH": PATH}).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for key in ("CPUs", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore"):
        m = re.search(rf"\b{key}=(\d+)", out)
        if m:
            found[key] = int(m.group(1))
    if len(found) < 4:
        cpus = os.cpu_count() or 1
        found = {"CPUs": cpus, "SocketsPerBoard": 1, "CoresPerSocket": cpus, "ThreadsPerCore": 1}
    return found


def slurm_conf(n: int, hw: Dict[str, int]) -> str:
    names = ",".join(host_name(i) for i in range(1, n + 1))
    addresses = ",".join(host_address(i) for i in range(1, n + 1))
    return f"""\
# written by `multihost lab up --slurm`
ClusterName=multihostlab
SlurmctldHost={CTL_NAME}({CTL_ADDRESS})
NodeName={names} NodeAddr={addresses} CPUs={hw['CPUs']} Sockets={hw['SocketsPerBoard']} \
CoresPerSocket={hw['CoresPerSocket']} ThreadsPerCore={hw['ThreadsPerCore']} State=UNKNOWN
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
# No cgroup fs is visible in a network namespace: track tasks by their parent pids.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
StateSaveLocation={STATE_DIR}
SlurmdSpoolDir={SPOOL_DIR}
SlurmctldLogFile={HOST_LOG_DIR}/slurmctld.log
SlurmdLogFile={HOST_LOG_DIR}/slurmd.log
# A dead host is noticed in seconds, not five minutes, and comes back by itself.
SlurmdTimeout=10
ReturnToService=2
KillWait=5
MailProg=/bin/true
"""


def cgroup_conf() -> str:
    # Without it slurmd autodetects cgroups, finds no /sys/fs/cgroup and exits; v1 is
    # loaded but never used with proctrack/linuxproc and task/none.
    return "# written by `multihost lab up --slurm`\nCgroupPlugin=cgroup/v1\n"


def binds(paths: LabPaths) -> List[List[str]]:
    return [[str(paths.slurm_etc), "/etc/slurm"], [str(paths.munge_etc), "/etc/munge"]]


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def prepare(paths: LabPaths, n: int) -> Dict[str, object]:
    """Write /etc/slurm, a fresh munge key and the controller machine's dirs; return its
    init config (for init.py)."""
    for d, mode in [(paths.slurm_etc, 0o755), (paths.munge_etc, 0o700), (paths.ctl_log, 0o755),
                    (paths.ctl_boot, 0o700)]:
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, mode)
    _write(paths.slurm_etc / "slurm.conf", slurm_conf(n, hardware()).encode(), 0o644)
    _write(paths.slurm_etc / "cgroup.conf", cgroup_conf().encode(), 0o644)
    # munged checks that its key is the owner's alone; any 1 KiB of randomness is a key.
    _write(paths.munge_etc / "munge.key", os.urandom(1024), 0o400)
    return {"hostname": CTL_NAME, "address": CTL_ADDRESS, "sshd": None, "boot": str(paths.ctl_boot),
            "root": None, "tmp": None, "log": str(paths.ctl_log), "etc_hosts": str(paths.etc_hosts),
            "resolv_conf": str(paths.resolv_conf), "run_dir": HOST_RUN_DIR, "log_dir": HOST_LOG_DIR,
            "shares": [], "binds": binds(paths)}


def ns_argv(init: procs.Proc, argv: Sequence[str]) -> List[str]:
    """argv inside a lab machine (a host, or ctl) with a clean environment, as its own
    boot scripts would start a daemon: it forks into the background and stays there,
    a child of the machine's PID 1."""
    return ["nsenter", "-t", str(init.pid), "-n", "-m", "-u", "-i", "-p", "--wd=/", "--",
            "env", "-i", f"PATH={PATH}", "HOME=/root", "LANG=C.UTF-8", *argv]


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    # The PMIx line is in every daemon's log and never the cause.
    text = [line for line in text if "pmix" not in line.lower()]
    return " | ".join(text[-lines:]) if text else "(empty log)"


def _run_all(commands: Dict[str, List[str]], paths_of: Dict[str, Path]) -> None:
    running = {who: subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
               for who, argv in commands.items()}
    for who, proc in running.items():
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise LabError(f"the Slurm daemons of {who} did not start: "
                           f"{err.strip() or _log_tail(paths_of[who] / 'daemons.log')}",
                           fix=f"see {paths_of[who]} (daemons.log, munged.log, slurm*.log)")


def start(paths: LabPaths, ctl: procs.Proc, inits: Dict[int, procs.Proc],
          timeout: float = 30.0) -> None:
    """munged and slurmctld on ctl, then munged and slurmd on every host; return once
    every node is idle."""
    deadline = time.monotonic() + timeout
    while not (paths.ctl_log / "booted").exists():
        if not procs.alive(ctl) or time.monotonic() > deadline:
            raise LabError(f"the controller machine ctl did not boot: {_log_tail(paths.ctl_log / 'init.log')}",
                           fix="that is the end of its init.log; check that unshare and mount work here")
        time.sleep(0.01)
    _run_all({CTL_NAME: ns_argv(ctl, ["sh", "-c", START + f"mkdir -p {STATE_DIR}; slurmctld"])},
             {CTL_NAME: paths.ctl_log})
    _run_all({host_name(i): ns_argv(init, ["sh", "-c", START + f"mkdir -p {SPOOL_DIR}; slurmd"])
              for i, init in inits.items()},
             {host_name(i): paths.host_log(i) for i in inits})
    wait_idle(paths, ctl, len(inits), timeout)


def node_states(ctl: procs.Proc) -> Dict[str, str]:
    """{node: state} as sinfo reports it on the controller ("idle", "alloc", "down*")."""
    out = subprocess.run(ns_argv(ctl, ["sinfo", "-h", "-N", "-o", "%N %T"]), capture_output=True,
                         text=True, timeout=30, stdin=subprocess.DEVNULL)
    return dict(line.split(None, 1) for line in out.stdout.splitlines() if " " in line)


def wait_idle(paths: LabPaths, ctl: procs.Proc, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    states: Dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(ctl)
        if len(states) == n and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.1)
    stuck = sorted(set(host_name(i) for i in range(1, n + 1)) - {k for k, v in states.items()
                                                                 if v == "idle"})
    where = paths.host_log(int(stuck[0][1:])) / "slurmd.log" if stuck else paths.ctl_log / "slurmctld.log"
    raise LabError(f"Slurm node {stuck[0] if stuck else '?'} is not idle after {timeout:g}s "
                   f"({states.get(stuck[0], 'unknown') if stuck else states}): {_log_tail(where)}",
                   fix=f"see {where} and {paths.ctl_log / 'slurmctld.log'}")
