"""Slurm: the allocation multihost runs in (allocation.py); commands reach its nodes
through `srun --overlap` (transport/srun.py)."""
from .allocation import Allocation, allocated_gpus, current, expand_nodelist

__all__ = ["Allocation", "allocated_gpus", "current", "expand_nodelist"]
