"""Slurm: the allocation multihost runs in (allocation.py), which hosts a command takes
and how it reaches them (inventory.py); commands reach the nodes through
`srun --overlap` (transport/srun.py)."""
from .allocation import Allocation, allocated_gpus, current, expand_nodelist
from .inventory import TRANSPORTS, Plan, plan, reached_by, with_allocation_gpus

__all__ = ["Allocation", "Plan", "TRANSPORTS", "allocated_gpus", "current", "expand_nodelist",
           "plan", "reached_by", "with_allocation_gpus"]
