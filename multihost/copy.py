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
from typing import List, Sequence, Tuple

from .errors import ConfigError
from .hosts import Host
from .transport import SshOptions, is_local_host
from .transport.srun import remote_shell
from .untrusted import clean_text

# -r -l -t: the tree, its links (inside it only) and times, so an unchanged file is
# skipped by size and time; --partial keeps half a checkpoint for the next try.
RSYNC = ["rsync", "-rlt", "--safe-links", "--partial", "--protect-args"]
PARALLEL = 16
NO_RSYNC_HERE = ("rsync is not installed on the controller",
                 "install rsync (e.g. `apt-get install rsync`)")


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
    return remote_arg(host, path)


def _copy(host: Host, options: SshOptions, source: str, dest: str, remote: str,
          to_host: bool) -> Copied:
    argv = list(RSYNC) + ["--mkpath"]   # a first copy makes the destination's folders
    if not is_local_host(host):
        argv += ["-e", shlex.join(remote_shell(host, options))]
    shown = (source, f"{host.label}:{remote}") if to_host else (f"{host.label}:{remote}", dest)
    code, said = run_rsync(argv + ["--", source, dest])
    if code == 0:
        return Copied(host.label, *shown)
    if code == 23 and "No such file or directory" in said:
        return Copied(host.label, *shown, f"{shown[0]} does not exist",
                      f"see what is there: `multihost exec --ips {host.name} -- ls "
                      f"{shlex.quote(posixpath.dirname(remote) or '.')}`" if not to_host
                      else "give a path that exists")
    return Copied(host.label, *shown, *rsync_failure(code, said, host.label, host.name,
                                                     again="run the same copy again"))


def remote_arg(host: Host, path: str) -> str:
    """The argument rsync reads as ``path`` on ``host`` (an IPv6 address in brackets)."""
    target = host.name if ":" not in host.name else f"[{host.name}]"
    return f"{target}:{path}"


def run_rsync(argv: Sequence[str], *, progress: bool = False) -> Tuple[int, str]:
    """rsync's exit status and what it said (its last 2,000 characters, cleaned);
    (-1, ...) when there is no rsync here. ``progress``: its output goes to the screen."""
    try:
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL,
                              stdout=None if progress else subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    except FileNotFoundError:
        return -1, ""
    return done.returncode, clean_text(done.stderr.decode(errors="replace")[-2000:])


def rsync_failure(code: int, said: str, label: str, name: str, again: str) -> Tuple[str, str]:
    """(cause, fix) of a failed rsync that every copy reads alike: no rsync here or on the
    host, a host not reached, or rsync's own last word (``again``: the fix that retries)."""
    if code == -1:
        return NO_RSYNC_HERE
    if "command not found" in said or code == 127:
        return ("rsync is not installed on the host",
                f"install rsync on {label} (e.g. `apt-get install rsync`)")
    lines = said.strip().splitlines()
    if code == 255:
        return (f"cannot reach the host: {lines[-1] if lines else 'ssh failed'}",
                f"try `multihost check --ips {name}`")
    return (f"rsync failed: {lines[-1] if lines else f'exit status {code}'}",
            f"{again}: what arrived is kept")
