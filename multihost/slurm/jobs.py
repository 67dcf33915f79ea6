"""The cluster's Slurm jobs as squeue shows them, every user's, for `status --all`: the
scheduler's view of the team's work beside multihost's own (registry/holders.py).

    jobs = cluster_jobs()     # None: no squeue here, or it did not answer
    jobs[0].state             # 'RUNNING', 'PENDING', ...
    jobs[0].where             # the nodes ('h[1-2]'), or why it waits ('(Resources)')
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

from ..untrusted import clean_text

# squeue's fields, the job name last: it is the one a user may write anything in.
FORMAT = "%i|%u|%T|%M|%D|%R|%j"
# Where Slurm's clients find the cluster's configuration (Debian's and the configless
# cache of slurmd). Without one squeue would look for a controller in DNS (SRV records):
# a machine with Slurm's clients installed and no cluster is not asked.
CONFIGS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/run/slurm/conf/slurm.conf",
           "/var/spool/slurmd/conf-cache/slurm.conf")
HEADERS = ("JOBID", "USER", "STATE", "TIME", "NODES", "NODELIST(REASON)", "NAME")


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    user: str
    state: str        # RUNNING, PENDING, COMPLETING, ...
    time: str         # how long it has run, as squeue writes it ('0:00' while pending)
    nodes: str        # how many
    where: str        # its node list, or '(Reason)' while it waits
    name: str

    def to_json(self) -> dict:
        return asdict(self)

    def row(self) -> Tuple[str, ...]:
        return (self.job_id, self.user, self.state, self.time, self.nodes, self.where,
                self.name)


def parse(text: str) -> Tuple[SlurmJob, ...]:
    """squeue -h -o FORMAT's lines as jobs (squeue's own order: by state, then priority)."""
    jobs = []
    for line in text.splitlines():
        cells = line.split("|", 6)
        if len(cells) == 7 and cells[0].strip():
            jobs.append(SlurmJob(*(clean_text(c.strip(), 200) for c in cells)))
    return tuple(jobs)


def cluster_jobs(timeout: float = 5.0) -> Optional[Tuple[SlurmJob, ...]]:
    """Every job Slurm knows (all users, all partitions), or None where there is no Slurm
    to ask (squeue not on PATH, or it fails: no controller answering)."""
    squeue = shutil.which("squeue")
    if not squeue or not configured():
        return None
    try:
        done = subprocess.run([squeue, "-h", "-a", "-o", FORMAT], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse(done.stdout) if done.returncode == 0 else None


def configured(env=None) -> bool:
    """Is this machine part of a Slurm cluster (a configuration, or an allocation)?"""
    env = os.environ if env is None else env
    return bool(env.get("SLURM_CONF") or env.get("SLURM_JOB_ID")) \
        or any(os.path.exists(path) for path in CONFIGS)
