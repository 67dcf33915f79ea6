"""Where a command's hosts come from and how they are reached, inside or outside Slurm.

    --ips/--hostfile given       those hosts, over ssh (``--transport srun``: their names
                                 are Slurm nodes of the allocation, reached by srun)
    neither, in an allocation    the allocation's nodes in Slurm's order, by srun
                                 (``--transport ssh``: the same nodes, over ssh)
    neither, outside one         this machine alone, as always
"""
from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..host_parsing import parse_gpu_ids
from ..hosts import Host
from .allocation import Allocation, current

TRANSPORTS = ("ssh", "srun")


@dataclass(frozen=True)
class Plan:
    transport: str                        # "ssh" or "srun"
    allocation: Optional[Allocation]      # the allocation, when in one
    nodes: Optional[Tuple[str, ...]]      # the hosts to take from it; None: --ips/--hostfile's

    @property
    def ips(self) -> Optional[str]:
        return ",".join(self.nodes) if self.nodes else None


def plan(transport: Optional[str], ips: Optional[str], hostfile: Optional[str],
         env: Optional[Mapping[str, str]] = None, scontrol: Optional[str] = None) -> Plan:
    env = os.environ if env is None else env
    if transport not in (None,) + TRANSPORTS:
        raise ConfigError(f"--transport {transport!r} is not ssh or srun", fix="--transport ssh")
    given = ips is not None or hostfile is not None
    if transport == "ssh" and given:
        return Plan("ssh", None, None)      # never ask Slurm for what it is not used for
    alloc = current(env, scontrol)
    if alloc is None:
        if transport == "srun":
            raise ConfigError("--transport srun runs commands as steps of a Slurm allocation, "
                              "and this is not inside one (no SLURM_JOB_ID)",
                              fix="run inside one: salloc -N 2, then the same multihost command")
        return Plan("ssh", None, None)
    chosen = transport or ("ssh" if given else "srun")
    return Plan(chosen, alloc, None if given else alloc.nodes)


def reached_by(plan: Plan, options):
    """How a command's hosts are reached under ``plan``: as steps of the allocation
    (``SrunOptions``, ``options``' ssh fields kept for what still goes over ssh), or with
    ``options`` as they are."""
    if plan.transport != "srun":
        return options
    from ..transport import SrunOptions

    return SrunOptions(**vars(options), job_id=plan.allocation.job_id)


def with_allocation_gpus(hosts: Sequence[Host], alloc: Optional[Allocation],
                         transport: str = "ssh", srun: str = "srun") -> Tuple[Host, ...]:
    """Hosts that do not say their GPUs take the allocation's. Reached by srun, each
    node's are the ones a step of the job sees there (``step_gpus``): the launcher is a
    step too. Over ssh they are the allocation's own device indexes."""
    if alloc is None or alloc.gpus is None:
        return tuple(hosts)
    wanted = [h for h in hosts if h.gpus is None]
    seen = step_gpus(alloc.job_id, [h.name for h in wanted], srun) if transport == "srun" else {}
    return tuple(h if h.gpus is not None else replace(h, gpus=seen.get(h.name) or alloc.gpus)
                 for h in hosts)


def step_gpus(job_id: str, nodes: Sequence[str], srun: str = "srun") -> Dict[str, Tuple[int, ...]]:
    """{node: the CUDA_VISIBLE_DEVICES a step of the job gets there}, asked of each node
    at once. Slurm sets it per step: by default a step gets all the job's GPUs on the
    node (and --overlap shares them), as their device indexes, or renumbered from 0 where
    cgroups constrain the devices. A node that does not answer is left out."""
    def ask(node: str) -> Optional[Tuple[int, ...]]:
        argv = [srun, "--overlap", "--nodes=1", "--ntasks=1", "-w", node, "--jobid", job_id,
                "--quiet", "printenv", "CUDA_VISIBLE_DEVICES"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                                  stdin=subprocess.DEVNULL)
            return parse_gpu_ids(done.stdout.strip(), f"{node}: CUDA_VISIBLE_DEVICES") \
                if done.returncode == 0 and done.stdout.strip() else None
        except (OSError, subprocess.SubprocessError, ConfigError):
            return None

    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        found = dict(zip(nodes, pool.map(ask, nodes)))
    return {node: gpus for node, gpus in found.items() if gpus is not None}
