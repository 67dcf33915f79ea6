"""The lab: real SSH hosts on this one machine, made of Linux namespaces.

See docs/lab.md. ``Lab`` is the API; ``multihost lab`` is its command.
"""
from .config import DEFAULT_NAME, host_address
from .lab import HostStatus, Lab, LabState

__all__ = ["DEFAULT_NAME", "HostStatus", "Lab", "LabState", "host_address"]
