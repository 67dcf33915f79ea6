"""The inventory: ``--ips`` or a hostfile become an ordered tuple of frozen Host records.

The order the user gave is the node rank order and is never sorted: host k is node
rank k, and the first host's first GPU is global rank 0. What the user wrote is read
and checked by host_parsing.py; here the flags are applied, a machine listed twice is
refused, and ``--include``/``--exclude`` pick hosts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from .errors import ConfigError
from .host_parsing import check_host_count, check_user, parse_hostfile, parse_ips
from .local_python import local_default
from .nodeset import expand, fold

# A workdir that is the code directory itself, at its own path: the default with no hosts
# (this machine runs the job in place; job.in_place says where nothing is synced).
IN_PLACE = "."


@dataclass(frozen=True)
class Host:
    """One machine of the job. ``name`` is what the user wrote: an address or an ssh alias."""

    name: str
    rank: int = 0
    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    workdir: Optional[str] = None       # None: the command's default (see workdir_for)
    python: str = "python3"
    gpus: Optional[Tuple[int, ...]] = None   # None: not said; (): no GPUs
    iface: Optional[str] = None
    data: Tuple[str, ...] = ()
    slots: Optional[int] = None          # processes on this host (`slots=N`); None: not said
    launcher: Optional[str] = None      # [defaults] only: the job's launcher template

    @property
    def label(self) -> str:
        """How the host is shown to the user: its name, with the port when not 22."""
        if self.port and self.port != 22:
            name = f"[{self.name}]" if ":" in self.name else self.name
            return f"{name}:{self.port}"
        return self.name


@dataclass(frozen=True)
class HostOptions:
    """Flags that apply to every host; a flag given on the command line beats the hostfile."""

    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    workdir: Optional[str] = None
    python: Optional[str] = None
    data: Tuple[str, ...] = ()


PROJECT = "{project}"   # in a workdir: the name of the code directory (see job.workdir_for)


def project_workdir(workdir: str) -> str:
    """A hostfile's workdir is where every project's directory goes, not one directory
    for all of them: ``/root/work`` holds ``/root/work/<code dir name>``, so two projects
    that share a hostfile never sync into (and fetch from) one directory. A workdir that
    places ``{project}`` itself, or the in-place ``.``, is taken as written; ``--workdir``
    (and the API's ``workdir=``) names the one directory, as typed."""
    if workdir == IN_PLACE or PROJECT in workdir:
        return workdir
    return workdir.rstrip("/") + "/" + PROJECT if workdir.rstrip("/") else "/" + PROJECT


def build_hosts(entries: Sequence[Dict[str, object]], options: HostOptions) -> Tuple[Host, ...]:
    """Apply the command-line flags and check for duplicates; ranks follow the order."""
    hosts = []
    seen: Dict[Tuple[str, int], str] = {}
    for rank, entry in enumerate(entries):
        fields = {k: v for k, v in entry.items()
                  if not k.startswith("_") and k != "spare" and v is not None}
        if options.user is not None:
            check_user(options.user, "--user")
        workdir = fields.get("workdir")
        if workdir is not None and options.workdir is None:
            fields["workdir"] = project_workdir(str(workdir))
        for flag in ("user", "port", "identity_file", "workdir", "python"):
            value = getattr(options, flag)
            if value is not None:
                fields[flag] = value
        if options.data:
            fields["data"] = tuple(fields.get("data", ())) + tuple(options.data)  # type: ignore[arg-type]
        host = Host(rank=rank, **fields)  # type: ignore[arg-type]
        key = (host.name.lower(), host.port or 22)
        where = str(entry.get("_where", host.name))
        if key in seen:
            raise ConfigError(f"{where}: host {host.label} is listed twice (first at {seen[key]})",
                              fix="list every machine once; its position is its node rank")
        seen[key] = where
        hosts.append(host)
    return tuple(hosts)


def load_hosts(ips: Optional[str], hostfile: Optional[str],
               options: HostOptions = HostOptions()) -> Tuple[Host, ...]:
    """The hosts of a command: ``--ips``, ``--hostfile``, or this machine alone (the
    hostfile's spares left out: they are not part of the job)."""
    return load_inventory(ips, hostfile, options)[0]


def load_inventory(ips: Optional[str], hostfile: Optional[str],
                   options: HostOptions = HostOptions(),
                   spares: Sequence[Dict[str, object]] = ()) -> Tuple[Tuple[Host, ...], Tuple[Host, ...]]:
    """The job's hosts (node rank = position) and the spares: the hostfile's ``spare =
    true`` hosts, then ``spares`` (``--spares``, parsed). Spares are numbered after the
    job's hosts, so one machine listed twice is refused wherever it appears."""
    if ips is not None and hostfile is not None:
        raise ConfigError("both --ips and --hostfile were given", fix="use one of them")
    if hostfile is not None:
        entries = parse_hostfile(Path(hostfile).expanduser())
        check_host_count(len(entries), hostfile)
    elif ips is not None:
        entries = parse_ips(ips)
        check_host_count(len(entries), "--ips")
    else:
        # The single-machine case of the reference docs; its python is the one multihost
        # runs in when only that one has the framework (a venv not on PATH).
        python = None
        if options.python is None:
            python = local_default()
        # Like torchrun, the job runs in place: in the code directory, nothing copied
        # (--workdir still chooses another directory).
        entries = [{"name": "127.0.0.1", "python": python, "workdir": IN_PLACE}]
    job = [e for e in entries if not e.get("spare")]
    spare = [e for e in entries if e.get("spare")] + list(spares)
    if not job:
        raise ConfigError(f"{hostfile}: every host is a spare",
                          fix="leave spare = true off the hosts the job runs on")
    hosts = build_hosts(job + spare, options)
    return hosts[:len(job)], hosts[len(job):]


def select_hosts(hosts: Sequence[Host], include: Optional[str],
                 exclude: Optional[str]) -> Tuple[Host, ...]:
    """``--include``/``--exclude`` (DeepSpeed's names): host names, labels (name:port) or
    node sets (``10.0.0.[1-4]``). Kept hosts keep their relative order and are numbered
    again from 0, so node rank is still position. Every name must match a host: a typo
    in --exclude would otherwise run on the very machine meant to be left out."""
    if include is None and exclude is None:
        return tuple(hosts)   # numbered already
    kept = list(hosts)
    for flag, text in (("--include", include), ("--exclude", exclude)):
        if text is None:
            continue
        if not text.strip():
            raise ConfigError(f"{flag} is empty", fix=f"name hosts, e.g. {flag} 10.0.0.[1-2]")
        names = expand(text, flag)
        wanted = {name.lower() for name in names}
        known = {key for host in hosts for key in _match_keys(host)}
        unknown = [name for name in names if name.lower() not in known]
        if unknown:
            raise ConfigError(f"{flag}: {fold(unknown)} is not one of the hosts "
                              f"({fold([h.label for h in hosts])})",
                              fix="name hosts as --ips or the hostfile name them")
        keep = flag == "--include"
        kept = [h for h in kept if bool(wanted & set(_match_keys(h))) == keep]
    if not kept:
        raise ConfigError("--include/--exclude leave no host",
                          fix="keep at least one host")
    return tuple(replace(host, rank=rank) for rank, host in enumerate(kept))


def _match_keys(host: Host) -> Tuple[str, ...]:
    keys = {host.name.lower(), host.label.lower()}
    if host.user:
        keys.add(f"{host.user}@{host.name}".lower())
    return tuple(keys)
