"""What the job asks of every host: processes per node, GPUs, ports, data, code.

``check``, ``sync`` and ``run`` take the same job options so that ``check`` checks
exactly the job that ``run`` would start. This is the blueprint; the runtime state of a
started run lives elsewhere (``run/records.py``).
"""
from __future__ import annotations

import os
import posixpath
import shlex
import sys
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from .errors import ConfigError
from .host_parsing import parse_gpu_ids, parse_port
from .hosts import IN_PLACE, PROJECT, Host

# The reference docs recommend one FLAGS_START_PORT in 10000-20000 on every machine.
DEFAULT_START_PORT = 17000
AUTO_PORT_RANGE = (10000, 20000)


@dataclass(frozen=True)
class JobOptions:
    gpus: Optional[Tuple[int, ...]] = None     # --gpus; None: the hostfile's, else CPU
    nproc_per_node: Optional[int] = None       # --nproc_per_node; None: len(gpus) or 1
    start_port: Optional[int] = DEFAULT_START_PORT  # None means "auto": check picks one
    data: Tuple[str, ...] = ()
    code: str = "."
    frameworks: Tuple[str, ...] = ()           # what the launcher imports: torchrun, torch
    gpus_from: str = "--gpus"                  # where ``gpus`` came from, for a fix to name:
                                               # --gpus, or CUDA_VISIBLE_DEVICES (fleetrun)
    image: Optional[str] = None                # --image: the job runs in it (the check's
    engine: Optional[str] = None               # image column); --engine
    image_from_controller: bool = False        # the hosts' image is replaced by this one's

    def gpus_for(self, host: Host) -> Tuple[int, ...]:
        """The devices this host's ranks use: --gpus beats the hostfile; () is CPU."""
        if self.gpus is not None:
            return self.gpus
        return host.gpus or ()

    def nproc_for(self, host: Host) -> int:
        """--nproc_per_node, else the hostfile's ``slots=N``, else one per GPU, else 1."""
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        return host.slots or len(self.gpus_for(host)) or 1

    def check_devices(self, hosts: Sequence[Host]) -> None:
        """More processes than devices would share GPUs without anyone having asked
        (4 processes on 2 GPUs): refused, naming where the devices came from."""
        wanted = self.nproc_per_node
        for host in hosts:
            gpus = self.gpus_for(host)
            if not gpus or wanted is None or wanted <= len(gpus):
                continue
            source = "--gpus" if self.gpus is not None else "the hostfile's gpus ="
            raise ConfigError(
                f"--nproc_per_node {wanted} would put {wanted} processes on {len(gpus)} "
                f"device(s) ({source} {','.join(str(g) for g in gpus)})",
                host=None if self.gpus is not None else host.label,
                fix=f"list {wanted} devices with --gpus, or drop --nproc_per_node: one "
                    "process per device is the default")

    def ports(self, start_port: int, host: Host) -> Tuple[int, ...]:
        """The ports a node needs: the master/rendezvous port, then one per local trainer."""
        return tuple(range(start_port, start_port + self.nproc_for(host) + 1))


def parse_start_port(text: Optional[str]) -> Optional[int]:
    """``--start-port``: a number, ``auto``, or (absent) the controller's FLAGS_START_PORT."""
    if text is None:
        text = os.environ.get("FLAGS_START_PORT") or str(DEFAULT_START_PORT)
        where = "FLAGS_START_PORT"
    else:
        where = "--start-port"
    if text.strip().lower() == "auto":
        return None
    return parse_port(text.strip(), where)


def parse_nproc(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise ConfigError(f"--nproc_per_node {text!r} is not a number from 1 to 1024",
                          fix="give the number of processes per host, e.g. --nproc_per_node 2")
    return int(text)


def job_options(*, gpus: Optional[str] = None, nproc_per_node: Optional[str] = None,
                start_port: Optional[str] = None, data: Sequence[str] = (), code: str = ".",
                gpus_from: str = "--gpus", image: Optional[str] = None,
                engine: Optional[str] = None, image_from_controller: bool = False,
                hosts: Sequence[Host] = ()) -> JobOptions:
    """The job from its flags' text, each value checked by its flag's parser; with
    ``hosts``, also checked against each host's devices (the hostfile's gpus count too)."""
    job = JobOptions(
        gpus=parse_gpu_ids(gpus, "--gpus") if gpus is not None else None,
        nproc_per_node=parse_nproc(nproc_per_node) if nproc_per_node else None,
        start_port=parse_start_port(start_port),
        data=tuple(data),
        # `--code '~/x'` (quoted, or from a job file) is the user's home, as the shell's
        code=os.path.expanduser(code or "."),
        gpus_from=gpus_from or "--gpus",
        image=image or None, engine=engine or None,
        image_from_controller=bool(image_from_controller),
    )
    job.check_devices(hosts)
    return job


def check_nnodes(text: str, hosts: Sequence[Host], argv: Optional[Sequence[str]] = None) -> None:
    """``--nnodes N`` (or torchrun's and paddle's ``MIN:MAX``), as typed for torchrun or
    paddle's launcher: multihost starts one node per host and gives each launcher the
    host count itself, so N is only a statement about the hosts, refused when it is
    wrong (a job waiting for a third node that never comes, or one node too many)."""
    low, colon, high = text.strip().partition(":")
    if not low.isdigit() or (colon and not high.isdigit()):
        raise ConfigError(f"--nnodes {text!r} is not a number of hosts (N or MIN:MAX)",
                          fix=f"leave --nnodes out: multihost starts one node per host "
                              f"({len(hosts)} here)")
    lowest, highest = int(low), int(high) if colon else int(low)
    if lowest <= len(hosts) <= highest:
        return
    given = ", ".join(h.label for h in hosts[:4]) + (", ..." if len(hosts) > 4 else "")
    words = list(sys.argv[1:] if argv is None else argv)
    typed = _without_nnodes(words)
    command = f"`multihost {shlex.join(typed)}`" if typed != words else "the command without --nnodes"
    raise ConfigError(
        f"--nnodes {text} but {len(hosts)} host{'s' if len(hosts) != 1 else ''} given ({given}): "
        f"multihost starts one node per host",
        fix=f"give {lowest if not colon else f'{lowest} to {highest}'} hosts, or leave --nnodes out (every launcher gets --nnodes="
            f"{len(hosts)}): {command}")


def _without_nnodes(words: Sequence[str]) -> list:
    """The command line as typed, less its ``--nnodes N`` (before any ``--``)."""
    out, skip, ended = [], False, False
    for word in words:
        if skip:
            skip = False
        elif ended:
            out.append(word)
        elif word == "--":
            ended = True
            out.append(word)
        elif word == "--nnodes":
            skip = True
        elif not word.startswith("--nnodes="):
            out.append(word)
    return out


def workdir_for(host: Host, code: str = ".") -> str:
    """Where the code lives on the host: its workdir (``.``: the code directory's own
    path; ``{project}``, which a hostfile's workdir ends with: the code directory's name),
    else ~/multihost/<code dir name>."""
    if host.workdir == IN_PLACE:
        return os.path.abspath(code)
    name = os.path.basename(os.path.abspath(code)) or "job"
    if host.workdir:
        base = host.workdir[:-len(PROJECT) - 1] if host.workdir.endswith("/" + PROJECT) else ""
        if base and (posixpath.basename(base.rstrip("/")) == name
                     or base.rstrip("/") == os.path.abspath(code)):
            # the hostfile already names this project's directory, or the code's own
            # path (a filesystem the hosts share): not a base for projects
            return base
        return host.workdir.replace(PROJECT, name)
    return f"~/multihost/{name}"


def in_place(host: Host, code: str = ".") -> bool:
    """Whether the job runs on ``host`` in the code directory itself (this machine, its
    workdir the code's own path): there is nothing to sync to it."""
    from .transport import is_local_host

    workdir = os.path.realpath(os.path.expanduser(workdir_for(host, code)))
    return workdir == os.path.realpath(code) and is_local_host(host)
