"""Shell completion (argcomplete): what a Tab after a word can offer.

Completers run on every Tab, so they only read local files (the run records under
~/.multihost/runs, a hostfile); they never reach a host, and a file that cannot be read
offers nothing rather than an error.
"""
from __future__ import annotations

from typing import List


def complete_run_ids(prefix: str = "", parsed_args=None, **_) -> List[str]:
    """Run ids recorded on this controller, newest first."""
    from ..run.records import run_ids

    return [r for r in reversed(run_ids()) if r.startswith(prefix)]


def _run(parsed_args):
    from ..errors import MultihostError
    from ..run.records import load_run

    try:
        return load_run(getattr(parsed_args, "run", None))
    except MultihostError:
        return None


def complete_run_hosts(prefix: str = "", parsed_args=None, **_) -> List[str]:
    """The hosts of the run named on the line (or of the last run)."""
    record = _run(parsed_args)
    return [] if record is None else [n.label for n in record.nodes if n.label.startswith(prefix)]


def complete_run_targets(prefix: str = "", parsed_args=None, **_) -> List[str]:
    """What `multihost ssh` takes: the run's global ranks and its hosts."""
    record = _run(parsed_args)
    if record is None:
        return []
    ranks = [str(r) for r in range(sum(record.nprocs))]
    return [t for t in ranks + [n.label for n in record.nodes] if t.startswith(prefix)]


def complete_hostfile_hosts(prefix: str = "", parsed_args=None, **_) -> List[str]:
    """``--ips a,<Tab>``: the hosts of the --hostfile given on the line, one more each Tab."""
    from ..errors import MultihostError
    from ..hosts import load_hosts

    path = getattr(parsed_args, "hostfile", None)
    if not path:
        return []
    try:
        names = [h.name for h in load_hosts(None, path)]
    except (MultihostError, OSError):
        return []
    done, _, last = prefix.rpartition(",")
    head = done + "," if done else ""
    given = set(done.split(",")) if done else set()
    return [head + n for n in names if n.startswith(last) and n not in given]


def complete_launchers(prefix: str = "", parsed_args=None, **_) -> List[str]:
    """``--launcher <Tab>``: the built-in launchers' names, then template files."""
    import glob
    import os

    from ..run.launchers import BUILTIN

    names = [name for name in BUILTIN if name.startswith(prefix)]
    files = [path + ("/" if os.path.isdir(path) else "")
             for path in sorted(glob.glob(os.path.expanduser(prefix) + "*"))]
    return names + files
