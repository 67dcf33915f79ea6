"""Where a run's log mirror lies on the controller, and what its names mean.

``<log_dir>/<run_id>/<host label>/`` holds a host's ``launcher.log`` and its ranks'
``log/workerlog.<local rank>`` (a parameter server's: ``log/serverlog.<N>``), each with
``.<name>.times`` beside it; ``<log_dir>/latest`` and ``workerlog.<global rank>`` are
links into the newest run. follow.py writes the mirror, mirror.py reads it; every
directory and file in it is the user's only (a job's output can hold secrets).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence, Tuple

from ..hosts import Host
from ..sync.ignore import MIRROR_MARKER


def mirror_path(mirror_dir: Path, host: Host) -> Path:
    return mirror_dir / host.label.replace("/", "_")


def times_path(log_file: Path) -> Path:
    """Beside each mirror file: when each chunk arrived, for ``logs --since``."""
    return log_file.with_name(f".{log_file.name}.times")


def local_rank_of(name: str) -> int:
    """workerlog.3 -> 3 (serverlog.3 -> 3, see role_of); the launcher's own log -> -1."""
    match = re.search(r"(\d+)$", name)
    return int(match.group(1)) if match and name.startswith("log/") else -1


def role_of(name: str) -> str:
    """"server" for a parameter server's log (paddle's serverlog.N); "" for a rank's."""
    return "server" if name.startswith("log/serverlog.") else ""


@dataclass(frozen=True)
class Node:
    host: Host
    nproc: int
    first_rank: int      # global rank of the node's local rank 0
    first_server: int = 0   # a parameter-server job: the index of the node's serverlog.0


def link_latest(mirror_dir: Path, nodes: Sequence[Node]) -> Path:
    """Where Paddle users look: ``<log_dir>/latest`` names the newest run's mirror, and in
    it ``workerlog.<global rank>`` each rank's log (``tail -f log/latest/workerlog.3``).
    Links, so the mirror stays one copy; each made aside and renamed over the old one, so
    a reader never finds the name missing."""
    for node in nodes:
        label = mirror_path(Path("."), node.host).name
        for local in range(node.nproc):
            _relink(mirror_dir / f"workerlog.{node.first_rank + local}",
                    f"{label}/log/workerlog.{local}")
    latest = latest_link(mirror_dir)
    _relink(latest, os.path.relpath(mirror_dir, latest.parent))
    return latest


def latest_link(mirror_dir) -> Path:
    """``<log_dir>/latest``, for a run's mirror ``<log_dir>/<run_id>`` or for an attempt's
    ``<log_dir>/<run_id>/attempt_<k>`` (--max-restarts): the newest attempt is the latest."""
    mirror_dir = Path(mirror_dir)
    root = mirror_dir.parent
    if mirror_dir.name.startswith("attempt_"):
        root = root.parent
    return root / "latest"


def _relink(link: Path, target: str) -> None:
    """Point ``link`` at ``target``; only a link is ever replaced (a file or directory of
    that name is someone's, kept, and the OSError says so)."""
    import errno
    import secrets

    if os.path.lexists(link) and not os.path.islink(link):
        kind = "directory" if os.path.isdir(link) else "file"
        raise OSError(errno.EEXIST, f"{link} is a {kind}, not a link: kept as it is")
    aside = link.with_name(f".{link.name}.{secrets.token_hex(8)}")   # a name nobody planted
    os.symlink(target, aside)
    try:
        os.replace(aside, link)
    except OSError:
        aside.unlink()   # nothing left beside it
        raise


def nodes_of(hosts_nprocs: Sequence[Tuple[Host, int]],
             first_servers: Sequence[int] = ()) -> List[Node]:
    nodes, first = [], 0
    for i, (host, nproc) in enumerate(hosts_nprocs):
        nodes.append(Node(host, nproc, first, first_servers[i] if i < len(first_servers) else 0))
        first += nproc
    return nodes


def make_private_dirs(directory: Path) -> None:
    """``mkdir -p`` where every directory made is the user's only (``parents=True`` would
    give the parents the umask's mode)."""
    if directory.is_dir():
        return
    make_private_dirs(directory.parent)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass


def private_opener(path, flags: int) -> int:
    """For open(): a new file is the user's only (a log can hold what the job printed)."""
    return os.open(path, flags, 0o600)


def ensure_private(directory: Path) -> Path:
    """Log mirrors can hold secrets printed by the job: readable by the user only. The
    marker beside the runs keeps code sync from shipping old logs back to the hosts
    (``./log`` usually sits inside the code directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    for place in (directory, directory.parent):
        marker = place / MIRROR_MARKER
        if not marker.exists():
            try:
                marker.touch(mode=0o600)
            except OSError:
                pass
    return directory
