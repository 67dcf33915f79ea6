"""Transports: how a command reaches a host (SSH, or this machine directly)."""
from __future__ import annotations

from ..hosts import Host
from .base import (BrokenStream, Command, CommandResult, Process, SshOptions, Transport,
                   quote_path, to_shell)
from .local import LocalTransport, is_local_host
from .srun import SrunOptions, SrunTransport
from .ssh import SshTransport


def open_transport(host: Host, options: SshOptions = SshOptions()) -> Transport:
    """A connected transport for the host: local for this machine, SSH otherwise;
    srun for a node of a Slurm allocation (``SrunOptions``)."""
    if isinstance(options, SrunOptions):
        return SrunTransport(host, options.job_id)
    if is_local_host(host):
        return LocalTransport(host)
    return SshTransport.connect(host, options)


__all__ = ["BrokenStream", "Command", "CommandResult", "LocalTransport", "Process", "SshOptions",
           "SrunOptions", "SrunTransport", "SshTransport", "Transport", "is_local_host", "open_transport", "quote_path", "to_shell"]
