"""Where a command's hosts come from and how they are reached, inside or outside Slurm.

    --ips/--hostfile given       those hosts, over ssh (``--transport srun``: their names
                                 are Slurm nodes of the allocation, reached by srun)
    neither, in an allocation    the allocation's nodes in Slurm's order, by srun
                                 (``--transport ssh``: the same nodes, over ssh)
    neither, outside one         this machine alone, as always
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
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


def with_allocation_gpus(hosts: Sequence[Host], alloc: Optional[Allocation]) -> Tuple[Host, ...]:
    """Hosts that do not say their GPUs take the allocation's (the same on every node)."""
    if alloc is None or alloc.gpus is None:
        return tuple(hosts)
    return tuple(h if h.gpus is not None else replace(h, gpus=alloc.gpus) for h in hosts)
