"""The Slurm allocation multihost runs in: its job id, its nodes in Slurm's order, and
their GPUs, read from the environment salloc, sbatch and srun set.

    alloc = current()                 # None outside an allocation
    alloc.nodes                       # ('h1', 'h2'): SLURM_JOB_NODELIST expanded
    alloc.gpus                        # (0, 1, 2, 3), () without GPUs, None: not said

The node list is expanded by `scontrol show hostnames` when scontrol is there (Slurm's
own parser, so whatever Slurm accepts is read as Slurm reads it), else by the node-set
parser of multihost (nodeset.expand), which reads every list Slurm writes:
``h[1-3,5],g7`` -> h1 h2 h3 h5 g7, ``node[08-10]`` keeps the width, ``rack[0-1]_n[0-1]``
multiplies, and the order is the list's own, never sorted (node rank = position).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from ..errors import ConfigError
from ..host_parsing import parse_gpu_ids
from ..nodeset import expand

# The variables an allocation is known by, newest spelling first (SLURM_NODELIST and
# SLURM_JOBID are the old names, still set).
JOB_ID = ("SLURM_JOB_ID", "SLURM_JOBID")
NODELIST = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")


def _first(env: Mapping[str, str], names: Tuple[str, ...]) -> Optional[str]:
    return next((env[n] for n in names if env.get(n)), None)


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: Tuple[str, ...]              # in Slurm's order: node rank = position
    gpus: Optional[Tuple[int, ...]]     # per node; None: the allocation does not say
    partition: Optional[str] = None
    in_step: bool = False               # this process runs under srun (a job step)

    @property
    def nodelist(self) -> str:
        return ",".join(self.nodes)


def expand_nodelist(text: str, scontrol: Optional[str] = None) -> Tuple[str, ...]:
    """Slurm's hostlist as names, in its order. ``scontrol``: the scontrol to ask (found
    on PATH when None; "" never asks)."""
    text = text.strip()
    if not text:
        raise ConfigError("SLURM_JOB_NODELIST is empty",
                          fix="run multihost inside an allocation: salloc -N 2, then multihost ...")
    path = shutil.which("scontrol") if scontrol is None else scontrol
    if path:
        try:
            done = subprocess.run([path, "show", "hostnames", text], capture_output=True,
                                  text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            done = None
        names = tuple(done.stdout.split()) if done and done.returncode == 0 else ()
        if names:
            return names
    return tuple(expand(text, "SLURM_JOB_NODELIST"))


def allocated_gpus(env: Mapping[str, str]) -> Optional[Tuple[int, ...]]:
    """The GPUs this node holds in the allocation: under srun the step's
    CUDA_VISIBLE_DEVICES (Slurm sets it to the step's devices), else SLURM_JOB_GPUS
    (their indexes), else SLURM_GPUS_ON_NODE (a count: devices 0..N-1); None when the
    allocation asked for no GPUs."""
    if env.get("SLURM_STEP_ID") is not None and env.get("CUDA_VISIBLE_DEVICES") is not None:
        return parse_gpu_ids(env["CUDA_VISIBLE_DEVICES"], "CUDA_VISIBLE_DEVICES")
    if env.get("SLURM_JOB_GPUS"):
        return parse_gpu_ids(env["SLURM_JOB_GPUS"], "SLURM_JOB_GPUS")
    count = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if count.isdigit():
        return tuple(range(int(count)))
    return None


def current(env: Optional[Mapping[str, str]] = None,
            scontrol: Optional[str] = None) -> Optional[Allocation]:
    """The allocation this process runs in (salloc's shell, an sbatch script, a task of
    srun), or None outside one."""
    env = os.environ if env is None else env
    job_id, nodelist = _first(env, JOB_ID), _first(env, NODELIST)
    if not job_id or nodelist is None:
        return None
    return Allocation(job_id, expand_nodelist(nodelist, scontrol), allocated_gpus(env),
                      env.get("SLURM_JOB_PARTITION"), env.get("SLURM_STEP_ID") is not None)
