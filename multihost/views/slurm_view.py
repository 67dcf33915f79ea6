"""Slurm's view of the cluster's jobs beside multihost's runs (`status --all`)."""
from __future__ import annotations

from typing import IO, Sequence

from ..slurm.jobs import HEADERS, SlurmJob


def render_jobs(jobs: Sequence[SlurmJob], out: IO[str]) -> None:
    """A table as squeue draws it, under a line that says whose view it is."""
    out.write(f"\nSlurm jobs (squeue, every user): {len(jobs) or 'none'}\n")
    if not jobs:
        return
    table = [HEADERS] + [job.row() for job in jobs]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADERS))]
    for row in table:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")
