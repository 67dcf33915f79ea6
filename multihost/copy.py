"""Files to and from the hosts outside any run: ``Cluster.put`` and ``Cluster.get``.

A dataset shard, a config or a checkpoint to start from goes to every host before a run;
a result comes back from one host or from each. It is what ``multihost fetch`` does for
a run's outputs: the system's ``rsync`` over the system's ``ssh``, with the host's user,
port, key and the cluster's host-key policy (a host that is this machine: a local
rsync), by content and resumable. Paths on a host are relative to the login's home, as
for ``scp`` (``~/x`` is ``x``), or absolute.

What a host sends is not trusted, as in fetch: links out of the copied tree are dropped
(``--safe-links``), owners and modes are not taken. No path reaches rsync as an option:
every one comes after ``--``, local ones absolute.
"""
from __future__ import annotations

import dataclasses
import os
import posixpath
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import List, Sequence

from .errors import ConfigError
from .hosts import Host
from .transport import SshOptions, is_local_host
from .transport.srun import remote_shell
from .untrusted import clean_text

# --mkpath: the destination's missing folders are made, as a first copy needs.
RSYNC = ["rsync", "-rlt", "--safe-links", "--partial", "--protect-args", "--mkpath"]
PARALLEL = 16


@dataclass(frozen=True)
class Copied:
    """One copy between here and one host: where it landed, or why not (with the fix)."""
    host: str
    source: str
    dest: str
    error: str = ""
    fix: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def put(hosts: Sequence[Host], options: SshOptions, local: str, remote: str) -> List[Copied]:
    """``local`` (a file or a folder) to ``remote`` on every host, all at once."""
    source = _local_path(local)
    if not os.path.exists(source):
        raise ConfigError(f"{local} does not exist here", fix="give a file or folder to put")
    where = _remote_path(remote)
    return _each(hosts, lambda host: _copy(host, options, source, _on(host, where), where,
                                           to_host=True))


def get(hosts: Sequence[Host], options: SshOptions, remote: str, local: str,
        every_host: bool) -> List[Copied]:
    """``remote`` from the first host into ``local``, or with ``every_host`` from each
    host into ``local/<host>/``."""
    where = _remote_path(remote)
    base = _local_path(local)
    chosen = list(hosts) if every_host else list(hosts[:1])

    def one(host: Host) -> Copied:
        into = os.path.join(base.rstrip("/"), host.label.replace("/", "_")) if every_host else base
        if every_host or local.endswith("/"):    # into a folder: the path's own name there
            copied = _copy(host, options, _on(host, where), into.rstrip("/") + "/", where,
                           to_host=False)
            landed = os.path.join(into, posixpath.basename(where.rstrip("/")) or "home")
            return dataclasses.replace(copied, dest=landed)
        return _copy(host, options, _on(host, where), into, where, to_host=False)
    return _each(chosen, one)


def _each(hosts: Sequence[Host], copy) -> List[Copied]:
    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL, len(hosts)))) as pool:
        return list(pool.map(copy, hosts))


def _local_path(path: str) -> str:
    if not path.strip():
        raise ConfigError("an empty local path", fix="give a file or folder, e.g. '.'")
    absolute = os.path.abspath(os.path.expanduser(path))   # never read as an option
    return absolute + "/" if path.endswith("/") else absolute


def _remote_path(path: str) -> str:
    """A path on a host as rsync's remote side takes it: from the login's home."""
    clean = path.strip()
    if not clean:
        raise ConfigError("an empty path on the hosts", fix="give one, e.g. 'data/' (from the home)")
    if clean in ("~", "~/"):
        return "."
    return clean[2:] if clean.startswith("~/") else clean


def _on(host: Host, path: str) -> str:
    """The argument rsync reads as ``path`` on ``host``."""
    if is_local_host(host):
        return os.path.join(os.path.expanduser("~"), path) if not path.startswith("/") else path
    target = host.name if ":" not in host.name else f"[{host.name}]"
    return f"{target}:{path}"


def _copy(host: Host, options: SshOptions, source: str, dest: str, remote: str,
          to_host: bool) -> Copied:
    argv = list(RSYNC)
    if not is_local_host(host):
        argv += ["-e", shlex.join(remote_shell(host, options))]
    shown = (source, f"{host.label}:{remote}") if to_host else (f"{host.label}:{remote}", dest)
    try:
        done = subprocess.run(argv + ["--", source, dest], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except FileNotFoundError:
        return Copied(host.label, *shown, "rsync is not installed on the controller",
                      "install rsync (e.g. `apt-get install rsync`)")
    if done.returncode == 0:
        return Copied(host.label, *shown)
    said = clean_text(done.stderr.decode(errors="replace")[-2000:]).strip()
    last = said.splitlines()[-1] if said else f"exit status {done.returncode}"
    if done.returncode == 23 and "No such file or directory" in said:
        return Copied(host.label, *shown, f"{shown[0]} does not exist",
                      f"see what is there: `multihost exec --ips {host.name} -- ls "
                      f"{shlex.quote(posixpath.dirname(remote) or '.')}`" if not to_host
                      else "give a path that exists")
    if done.returncode == 255:
        return Copied(host.label, *shown, f"cannot reach the host: {last}",
                      f"try `multihost check --ips {host.name}`")
    if "command not found" in said or done.returncode == 127:
        return Copied(host.label, *shown, "rsync is not installed on the host",
                      f"install rsync on {host.label} (e.g. `apt-get install rsync`)")
    return Copied(host.label, *shown, f"rsync failed: {last}", "run the same copy again: "
                                                               "what arrived is kept")
