"""Transports: how a command reaches a host (SSH, or this machine directly)."""
from __future__ import annotations

from ..hosts import Host
from .base import (BrokenStream, Command, CommandResult, Process, SshOptions, Transport,
                   quote_path, to_shell)
from .local import LocalTransport, is_local_host
from .srun import SrunOptions, SrunTransport

# paramiko (a third of a second of CPU) is imported when a host is first reached over
# it, not by every command that names a transport: `SshTransport` is looked up on use.


def __getattr__(name: str):
    if name == "SshTransport":
        from .ssh import SshTransport
        return SshTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_transport(host: Host, options: SshOptions = SshOptions()) -> Transport:
    """A connected transport for the host: local for this machine, SSH otherwise;
    srun for a node of a Slurm allocation (``SrunOptions``)."""
    if isinstance(options, SrunOptions):
        return SrunTransport(host, options.job_id)
    if is_local_host(host):
        return LocalTransport(host)
    from .ssh import SshTransport

    return SshTransport.connect(host, options)


__all__ = ["BrokenStream", "Command", "CommandResult", "LocalTransport", "Process", "SshOptions",
           "SrunOptions", "SrunTransport", "SshTransport", "Transport", "is_local_host", "open_transport", "quote_path", "to_shell"]
