"""Whether the Slurm job a run lives in has ended, and why, as Slurm says it.

When a node reached by srun stops answering, or its kept launch step ends, the monitor
asks Slurm once (``job_end``): ``scontrol show job -o JOB`` (JobState, Reason,
TimeLimit), else ``squeue``. A job that has ended ends the run at once: Slurm has ended
every rank already, so there is nothing to wait for and nothing left to stop.

Right after scancel or the time limit the job is COMPLETING (Slurm is still ending its
processes, up to KillWait) and JobState does not yet say why; its Reason does: TimeLimit
for the time limit, NodeDown for a node that failed, None for scancel.

Each way a job ends is one record of ENDINGS: its words and the fix. The exit status of
such a run is EXIT_SLURM_ENDED, 128+SIGTERM: the signal Slurm sends every task, the
status srun gives for a cancelled step, and multihost's own for a run stopped from
another shell.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Dict, Optional

EXIT_SLURM_ENDED = 128 + signal.SIGTERM

# Job states in which the allocation still holds its nodes.
ALIVE = ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "RESIZING", "REQUEUED",
         "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD")
_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=")


@dataclass(frozen=True)
class Ending:
    """One way a Slurm job ends: what is said of it, and the fix. In the fix, ``{again}``
    is a command that runs the same job in a new allocation (``multihost rerun`` inside
    salloc takes the new allocation's nodes), ``{nodes}`` the run's node count."""

    words: str
    fix: str


ENDINGS: Dict[str, Ending] = {
    "CANCELLED": Ending("was cancelled (CANCELLED by scancel)", "{again}"),
    "TIMEOUT": Ending("reached its time limit (TIMEOUT)", "ask for more time: {again}"),
    "NODE_FAIL": Ending("lost a node (NODE_FAIL)",
                        "`sinfo -R` says why Slurm took the node down; then {again}"),
    "PREEMPTED": Ending("was preempted by a job of higher priority (PREEMPTED)", "{again}"),
    "DEADLINE": Ending("reached its deadline (DEADLINE)", "{again}"),
    "OUT_OF_MEMORY": Ending("ran out of memory (OUT_OF_MEMORY)",
                            "ask for each node's whole memory (--mem=0): {again}"),
    "BOOT_FAIL": Ending("failed to boot a node (BOOT_FAIL)",
                        "`sinfo -R` says why; then {again}"),
    "COMPLETED": Ending("ended (COMPLETED: its batch script or salloc's command exited)",
                        "keep the job's script or shell waiting until the run ends: {again}"),
    "FAILED": Ending("ended (FAILED: its batch script or salloc's command failed)",
                     "keep the job's script or shell waiting until the run ends: {again}"),
    "GONE": Ending("has ended (Slurm no longer knows it)", "{again}"),
}
# While COMPLETING, the Reason says which ending it is.
_BY_REASON = {"TimeLimit": "TIMEOUT", "NodeDown": "NODE_FAIL", "DeadLine": "DEADLINE",
              "OutOfMemory": "OUT_OF_MEMORY", "BootFail": "BOOT_FAIL"}


@dataclass(frozen=True)
class JobEnd:
    """A Slurm job that has ended (or is COMPLETING), as Slurm said it."""

    job_id: str
    state: str                     # JobState as shown: CANCELLED, TIMEOUT, COMPLETING, ...
    reason: str = ""               # Reason as shown ("None" for scancel)
    time_limit: Optional[int] = None   # minutes; None: UNLIMITED or not said

    @property
    def cause(self) -> str:
        """The ENDINGS key: the state, or for COMPLETING the one its Reason names
        (scancel leaves Reason None)."""
        if self.state in ENDINGS:
            return self.state
        return _BY_REASON.get(self.reason, "CANCELLED" if self.state == "COMPLETING" else "GONE")

    @property
    def ending(self) -> Ending:
        return ENDINGS[self.cause]

    def line(self) -> str:
        """``Slurm job 7 reached its time limit (TIMEOUT) and Slurm ended every rank``."""
        return f"Slurm job {self.job_id} {self.ending.words} and Slurm ended every rank"

    def fix(self, nodes: int, run_id: str, batch: Optional[bool] = None) -> str:
        """The fix, typed as is: the same run again in a new allocation of ``nodes``
        nodes (in a batch job, as a batch job: sbatch sets ENVIRONMENT=BATCH for its
        script), with twice the time limit after a TIMEOUT and the nodes' whole memory
        after an OUT_OF_MEMORY."""
        if batch is None:
            batch = os.environ.get("ENVIRONMENT") == "BATCH"
        ask = f"-N {nodes}"
        if self.cause == "TIMEOUT":
            ask += f" --time={self.time_limit * 2}" if self.time_limit else " --time=UNLIMITED"
        if self.cause == "OUT_OF_MEMORY":
            ask += " --mem=0"
        again = (f"sbatch {ask} --wrap 'multihost rerun {run_id} --plain'" if batch
                 else f"salloc {ask} multihost rerun {run_id}")
        return self.ending.fix.format(again=again)


def _minutes(text: str) -> Optional[int]:
    """Slurm's [D-]HH:MM:SS (or MM:SS) as minutes; None for UNLIMITED."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text or "")
    if not match:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return max(1, days * 1440 + hours * 60 + minutes + (1 if seconds else 0))


def parse_scontrol(text: str) -> Dict[str, str]:
    """``scontrol show job -o``'s one line as {Key: value}. A value may hold spaces
    (``Reason=...``, a path), so each runs to the next `` Key=``: the one reader of
    scontrol's line, for a run's end here and a batch job's state (batch.py)."""
    keys = list(_KEY.finditer(text))
    ends = [m.start() for m in keys[1:]] + [len(text)]
    return {m.group(1): text[m.end():end].strip() for m, end in zip(keys, ends)}


def ended(job_id: str, fields: Dict[str, str]) -> Optional[JobEnd]:
    """A JobEnd from scontrol's fields, None while the job lives."""
    state = fields.get("JobState")
    if not state or state in ALIVE:
        return None
    return JobEnd(str(job_id), state, fields.get("Reason", ""), _minutes(fields.get("TimeLimit", "")))


def job_end(job_id: str, timeout: float = 10.0) -> Optional[JobEnd]:
    """Ask Slurm whether job ``job_id`` has ended: a JobEnd, or None while it runs or
    when Slurm does not answer (the run then goes on as before)."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            done = subprocess.run([scontrol, "show", "job", "-o", str(job_id)],
                                  capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            done = None
        if done is not None and done.returncode == 0 and "JobState=" in done.stdout:
            return ended(job_id, parse_scontrol(done.stdout))
        if done is not None and "Invalid job id" in done.stderr:
            return JobEnd(str(job_id), "GONE")
    return _from_squeue(job_id, timeout)


def _from_squeue(job_id: str, timeout: float) -> Optional[JobEnd]:
    try:
        done = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T %r %l"],
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    words = done.stdout.split()
    if done.returncode != 0 and "Invalid job id" in done.stderr or done.returncode == 0 and not words:
        return JobEnd(str(job_id), "GONE")
    if not words or words[0] in ALIVE:
        return None
    reason = words[1] if len(words) > 1 else ""
    return JobEnd(str(job_id), words[0], reason, _minutes(words[2]) if len(words) > 2 else None)
