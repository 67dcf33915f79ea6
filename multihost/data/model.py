"""The records of data verification and repair, and the one-line error of a mismatch:
what ``verify`` and ``repair`` compute and views render (both import this, never each
other the other way)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from ..errors import SyncError


@dataclass(frozen=True)
class PathState:
    path: str
    root: str
    exists: bool
    files: int = 0
    bytes: int = 0
    digest: str = ""
    hashed_bytes: int = 0            # read this time; 0 when the cache answered everything
    only: Optional[str] = None       # a single-file dataset: its name inside root
    unreadable: Tuple[Tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PathDiff:
    """How one host's copy of a path differs from the reference host's."""

    path: str
    reference: str
    absent: bool = False
    missing: Tuple[str, ...] = ()    # the first few of each; counts has the totals
    extra: Tuple[str, ...] = ()
    differing: Tuple[str, ...] = ()
    counts: Tuple[int, int, int] = (0, 0, 0)

    @property
    def empty(self) -> bool:
        return not self.absent and self.counts == (0, 0, 0)


@dataclass(frozen=True)
class HostData:
    host: str
    rank: int
    states: Tuple[PathState, ...] = ()
    diffs: Tuple[PathDiff, ...] = ()
    error: Optional[str] = None
    fix: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(d.empty for d in self.diffs)


@dataclass(frozen=True)
class DataReport:
    paths: Tuple[str, ...]
    hosts: Tuple[HostData, ...]
    odd_first: Tuple[str, ...] = ()  # paths where the first host alone differs
    seconds: float = 0.0
    # Full listings of the hosts that differ, by (rank, path): what sync_data works from.
    listings: Dict[Tuple[int, str], list] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    @property
    def mismatched(self) -> Tuple[HostData, ...]:
        return tuple(h for h in self.hosts if not h.ok)

    def error(self) -> SyncError:
        """The one-line error for this mismatch (see data_error); only when not ok."""
        return data_error(self)


def describe(diff: PathDiff) -> str:
    """One phrase for a difference: 'absent', or counts with the first names."""
    if diff.absent:
        return f"{diff.path} does not exist"
    parts = []
    for word, names, count in (("missing", diff.missing, diff.counts[0]),
                               ("extra", diff.extra, diff.counts[1]),
                               ("differing", diff.differing, diff.counts[2])):
        if count:
            shown = ", ".join(names[:2]) + (", ..." if count > 2 else "")
            parts.append(f"{count} {word} ({shown})")
    return f"{diff.path}: " + ", ".join(parts)


def data_error(report: DataReport, given: Optional[str] = None) -> SyncError:
    """The one-line error for a data mismatch: what `run` raises before starting. Its fix
    is a command that works when typed: ``given`` is the hosts as the user named them
    (``--ips=...``, ``--hostfile F``); by default the report's hosts as ``--ips``."""
    bad = report.mismatched
    first = bad[0]
    nowhere = [p for i, p in enumerate(report.paths)
               if all(h.diffs and h.diffs[i].absent for h in report.hosts if h.error is None)]
    if first.error:
        cause, fix = first.error, first.fix
    elif nowhere:
        return SyncError(f"{nowhere[0]} exists on none of the {len(report.hosts)} hosts",
                         fix="copy the dataset to the same path on every host first (or give "
                             "the path it has there)")
    else:
        cause = "; ".join(describe(d) for d in first.diffs if not d.empty)
        fix = f"run `{sync_data_command(report, given)}` to copy it from the first host, " \
              "host to host"
        if report.odd_first:
            fix = (f"the first host's copy of {report.odd_first[0]} differs from all the "
                   "others, which agree: repair it there, or list a good host first")
    if len(bad) == 1:
        return SyncError(f"data differs from the first host: {cause}", host=first.host, fix=fix)
    return SyncError(f"data differs on {len(bad)} of {len(report.hosts)} hosts "
                     f"({', '.join(h.host for h in bad[:4])}); {first.host}: {cause}", fix=fix)


def sync_data_command(report: DataReport, given: Optional[str] = None) -> str:
    """``multihost sync`` of the report's datasets on its hosts: without the hosts it
    would run on this machine alone."""
    import shlex

    if given is None:
        labels = [h.host for h in report.hosts]
        alone = len(labels) == 1 and labels[0] in ("127.0.0.1", "localhost")
        given = "" if alone else "--ips=" + shlex.quote(",".join(labels))
    words = " ".join(f"--data {shlex.quote(p)}" for p in report.paths)
    return " ".join(w for w in ("multihost sync", given, words, "--sync-data --no-code") if w)


@dataclass(frozen=True)
class HostDataSync:
    host: str
    rank: int
    files: int = 0
    bytes: int = 0
    moved_aside: int = 0
    trash: Tuple[str, ...] = ()      # where replaced and extra files went
    error: Optional[str] = None
    fix: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class DataSyncReport:
    hosts: Tuple[HostDataSync, ...]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)
