"""`multihost run --slurm -N 4 [--partition P] [--time T] [--gres G] -- train.py`: ask
Slurm for the allocation, run in it as inside `salloc`, release it at the end.

`salloc --no-shell` asks and waits in Slurm's queue (the queue is Slurm's: priorities,
limits, reasons), then leaves the granted allocation to us; the run then sees the same
SLURM_JOB_ID and node list a shell inside `salloc` would, and its commands are steps of
that job (`srun --jobid`). While it waits, ``~/.multihost/slurm/JOB.json`` says so, for
`multihost status` (``queued (Slurm job 1234, Resources)``). The allocation is cancelled
when the run ends, however it ends, and when Ctrl-C comes while it is still queued.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from ..errors import ConfigError, LaunchError

QUEUE_DIR = Path("~/.multihost/slurm")
JOB_NAME = "multihost"
_PENDING = re.compile(r"Pending job allocation (\d+)")
_GRANTED = re.compile(r"Granted job allocation (\d+)")


@dataclass(frozen=True)
class Ask:
    nodes: int
    partition: Optional[str] = None
    time: Optional[str] = None
    gres: Optional[str] = None

    def limits(self) -> List[str]:
        """The request beyond its node count, as salloc's and sbatch's own options."""
        return [f"{flag}={value}" for flag, value in (("--partition", self.partition),
                                                      ("--time", self.time), ("--gres", self.gres))
                if value]


def salloc_argv(ask: Ask) -> List[str]:
    return ["salloc", "--no-shell", f"--nodes={ask.nodes}", f"--job-name={JOB_NAME}", *ask.limits()]


def queue_path(job_id: str) -> Path:
    return QUEUE_DIR.expanduser() / f"{job_id}.json"


def queued_jobs() -> List[dict]:
    """The runs still waiting in Slurm's queue, as ``--slurm`` recorded them, each with
    Slurm's state and reason now (squeue); a record whose job is gone is dropped."""
    found = []
    directory = QUEUE_DIR.expanduser()
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("batch"):
            continue   # a batch job has a status of its own (batch.py)
        state, reason = squeue(record.get("job_id", ""))
        if state != "PENDING":
            continue   # granted (the run has started) or gone
        found.append(dict(record, state=state, reason=reason))
    return found


def squeue(job_id: str) -> "tuple[Optional[str], str]":
    """(state, reason) of a job as squeue shows it, or (None, "") when it is not there."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T %r"],
                             capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL).stdout.split(None, 1)
    except (OSError, subprocess.SubprocessError):
        return None, ""
    return (out[0], out[1].strip() if len(out) > 1 else "") if out else (None, "")


def queued_line(job: dict) -> str:
    return f"queued (Slurm job {job['job_id']}, {job.get('reason') or job.get('state')})"


def _nodelist(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True,
                         text=True, timeout=30, stdin=subprocess.DEVNULL)
    return out.stdout.strip()


def cancel(job_id: str) -> None:
    subprocess.run(["scancel", str(job_id)], capture_output=True, timeout=30,
                   stdin=subprocess.DEVNULL)


def _wait_granted(proc: "subprocess.Popen[str]", ask: Ask, say: Callable[[str], None],
                  seen: dict) -> None:
    """Read salloc's lines until it exits: the job id once pending, the grant."""
    assert proc.stderr is not None
    for line in proc.stderr:
        seen["last"] = line.strip()
        pending, granted = _PENDING.search(line), _GRANTED.search(line)
        if pending:
            seen["job"] = pending.group(1)
            path = queue_path(seen["job"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"job_id": seen["job"], "nodes": ask.nodes,
                                        "partition": ask.partition, "since": time.time(),
                                        "pid": os.getpid()}) + "\n")
            say(queued_line({"job_id": seen["job"], "reason": squeue(seen["job"])[1] or "waiting"}))
        elif granted:
            seen["job"] = granted.group(1)
    proc.wait()


@contextlib.contextmanager
def allocation(ask: Ask, say: Callable[[str], None]) -> Iterator[Dict[str, str]]:
    """The granted allocation as the environment salloc would give its shell; cancelled
    on the way out."""
    if ask.nodes < 1:
        raise ConfigError(f"-N {ask.nodes}: an allocation has at least one node", fix="-N 2")
    try:
        proc = subprocess.Popen(salloc_argv(ask), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)   # our Ctrl-C is ours to handle
    except FileNotFoundError:
        raise ConfigError("--slurm needs Slurm's salloc, and it is not on PATH",
                          fix="run on a Slurm login node, or use --ips/--hostfile") from None
    seen: dict = {}
    try:
        try:
            _wait_granted(proc, ask, say, seen)
        except BaseException:
            # Still queued: salloc revokes the request on SIGINT; scancel covers a grant
            # that came meanwhile.
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(30)
            if seen.get("job"):
                cancel(seen["job"])
            raise
        finally:
            if seen.get("job"):
                with contextlib.suppress(OSError):
                    queue_path(seen["job"]).unlink()
        job = seen.get("job")
        if proc.returncode != 0 or not job:
            said = seen.get("last") or f"salloc exited {proc.returncode}"
            raise LaunchError(f"Slurm gave no allocation: {said}",
                              fix="try the request by hand: "
                                  + " ".join(["salloc", *salloc_argv(ask)[2:], "hostname"]))
        env = {"SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": _nodelist(job)}
        if ask.partition:
            env["SLURM_JOB_PARTITION"] = ask.partition
        say(f"Slurm job {job}: nodes {env['SLURM_JOB_NODELIST']}")
        try:
            yield env
        finally:
            cancel(job)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def refuse_inside() -> None:
    inside = os.environ.get("SLURM_JOB_ID")
    if inside:
        raise ConfigError(f"--slurm asks for a new allocation, and this already runs in Slurm "
                          f"job {inside}", fix="leave out --slurm (and -N): the run takes this "
                                               "allocation's nodes")


@contextlib.contextmanager
def in_allocation(ask: Ask, say: Callable[[str], None]) -> Iterator[Dict[str, str]]:
    """Inside a new allocation for the block: this process has the environment salloc's
    shell would have (SLURM_JOB_ID, the node list), so the hosts a command takes are its
    nodes (``inventory.plan``); the allocation is released and the environment given back
    when the block is left. ``multihost run --slurm`` and ``Cluster.slurm`` both are this.
    With --detach the run is a batch job instead (batch.py)."""
    refuse_inside()
    with allocation(ask, say) as env:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield env
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
