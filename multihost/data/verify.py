"""Data verification (`--data PATH`) and repair (`--sync-data`).

    report = verify_data(cluster, ("/data/coco",))       # never raises for a mismatch
    if not report.ok:
        raise data_error(report)                           # what `run` does
    sync_data(cluster, ("/data/coco",), report=report)     # copy from the first host

Every host hashes its copy in parallel, through its own hash cache, and answers one
digest per path; only when digests differ are the listings fetched and compared, so an
unchanged dataset is verified in a fraction of a second and a changed one is listed
precisely: missing, extra and differing files per host, compared with the first host.

--sync-data copies what differs from the first host to the others, host to host (the
controller only sends the list of files), and moves what it replaces or removes into a
trash directory next to the dataset: nothing a user had is deleted. It refuses when the
first host is the odd one out (the others agree with each other): copying from it would
spread the damage.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import MultihostError, SyncError
from ..events import DataProgress, Listener
from ..fanout import Cluster
from ..sync.transfer import call_streaming, pipe_errors_raise

SHOWN = 5


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


def _scan(transport, paths: Sequence[str], base: Optional[str], verify: bool, listing: bool,
          on_progress: Callable[[dict], None]) -> List[dict]:
    request = {"paths": list(paths), "base": base, "verify": verify, "listing": listing}
    return call_streaming(transport, "data.scan", request, b"", on_progress)["paths"]


def _state(raw: dict) -> PathState:
    return PathState(raw["path"], raw.get("root", ""), bool(raw.get("exists")), raw.get("files", 0),
                     raw.get("bytes", 0), raw.get("digest", ""), raw.get("hashed_bytes", 0),
                     raw.get("only"), tuple((p, t) for p, t in raw.get("errors", [])))


def compare_listings(path: str, reference: str, ref_entries: list, entries: list) -> PathDiff:
    """Missing, extra and differing files of one host against the reference (pure)."""
    ref = {e[0]: (e[1], e[2], e[3]) for e in ref_entries}
    mine = {e[0]: (e[1], e[2], e[3]) for e in entries}
    missing = sorted(set(ref) - set(mine))
    extra = sorted(set(mine) - set(ref))
    differing = sorted(p for p in set(ref) & set(mine) if ref[p] != mine[p])
    return PathDiff(path, reference, False, tuple(missing[:SHOWN]), tuple(extra[:SHOWN]),
                    tuple(differing[:SHOWN]), (len(missing), len(extra), len(differing)))


def verify_data(cluster: Cluster, paths: Sequence[str], *, workdirs: Optional[Dict[int, str]] = None,
                verify: bool = False, listener: Optional[Listener] = None) -> DataReport:
    """Hash every path on every host and compare with the first host. Relative paths are
    taken from each host's workdir (``workdirs``), else its home directory. Never raises
    for a mismatch or an unreachable host: both are in the report."""
    emit = listener or (lambda event: None)
    started = time.monotonic()
    paths = tuple(dict.fromkeys(paths))
    workdirs = workdirs or {}

    def scan(host, transport, listing=False, subset=paths):
        def progress(p: dict) -> None:
            emit(DataProgress(host.label, host.rank, subset[p["path"]], p["files"], p["bytes"]))
        return _scan(transport, subset, workdirs.get(host.rank), verify and not listing,
                     listing, progress)

    first = cluster.map(scan)
    states: Dict[int, Dict[str, PathState]] = {}
    errors: Dict[int, MultihostError] = {}
    for result in first:
        if result.ok:
            states[result.host.rank] = {raw["path"]: _state(raw) for raw in result.value}
        else:
            errors[result.host.rank] = result.error
    labels = {h.rank: h.label for h in cluster.hosts}
    diffs: Dict[int, Dict[str, PathDiff]] = {rank: {} for rank in states}
    listings: Dict[Tuple[int, str], list] = {}
    odd_first: List[str] = []
    for path in paths:
        present = [r for r in sorted(states) if states[r][path].exists and not states[r][path].unreadable]
        if not present:
            for rank in states:
                diffs[rank][path] = PathDiff(path, "", absent=True)
            continue
        ref = present[0]
        digest = states[ref][path].digest
        differ = [r for r in present if states[r][path].digest != digest]
        for rank in states:
            if not states[rank][path].exists:
                diffs[rank][path] = PathDiff(path, labels[ref], absent=True)
        if not differ:
            continue
        others = {states[r][path].digest for r in present if r != ref}
        if ref == cluster.hosts[0].rank and len(present) >= 3 and len(others) == 1 and \
                len(differ) == len(present) - 1:
            odd_first.append(path)
        wanted = [ref] + differ
        fetched = cluster.map(lambda h, t: scan(h, t, True, (path,))[0],
                              [h for h in cluster.hosts if h.rank in wanted])
        for result in fetched:
            if result.ok:
                listings[(result.host.rank, path)] = result.value.get("entries", [])
            else:
                errors.setdefault(result.host.rank, result.error)
        ref_entries = listings.get((ref, path), [])
        for rank in differ:
            if (rank, path) in listings:
                diffs[rank][path] = compare_listings(path, labels[ref], ref_entries,
                                                     listings[(rank, path)])
    hosts = []
    for host in cluster.hosts:
        rank = host.rank
        if rank in errors:
            err = errors[rank]
            hosts.append(HostData(host.label, rank, error=err.cause, fix=err.fix))
            continue
        host_states = tuple(states[rank][p] for p in paths)
        unreadable = [(s.path, p, t) for s in host_states for p, t in s.unreadable]
        error = fix = None
        if unreadable:
            path, rel, text = unreadable[0]
            error = f"cannot read {path}/{rel}: {text}" + (
                f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else "")
            fix = "fix the files' permissions on that host"
        host_diffs = tuple(diffs[rank].get(p) or PathDiff(p, labels[cluster.hosts[0].rank])
                           for p in paths)
        hosts.append(HostData(host.label, rank, host_states, host_diffs, error, fix))
    return DataReport(paths, tuple(hosts), tuple(odd_first), time.monotonic() - started, listings)


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


def data_error(report: DataReport) -> SyncError:
    """The one-line error for a data mismatch: what `run` raises before starting."""
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
        paths = " ".join(f"--data {p}" for p in report.paths)
        fix = (f"run `multihost sync {paths} --sync-data` to copy it from the first host, "
               "host to host")
        if report.odd_first:
            fix = (f"the first host's copy of {report.odd_first[0]} differs from all the "
                   "others, which agree: repair it there, or list a good host first")
    if len(bad) == 1:
        return SyncError(f"data differs from the first host: {cause}", host=first.host, fix=fix)
    return SyncError(f"data differs on {len(bad)} of {len(report.hosts)} hosts "
                     f"({', '.join(h.host for h in bad[:4])}); {first.host}: {cause}", fix=fix)


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


def sync_data(cluster: Cluster, paths: Sequence[str], *, workdirs: Optional[Dict[int, str]] = None,
              listener: Optional[Listener] = None, report: Optional[DataReport] = None) -> DataSyncReport:
    """Copy what differs from the first host to the others, host to host."""
    from .repair import copy_from_first

    started = time.monotonic()
    report = report or verify_data(cluster, paths, workdirs=workdirs, listener=listener)
    with pipe_errors_raise():
        results = copy_from_first(cluster, report, listener or (lambda event: None))
    return DataSyncReport(tuple(results[h.rank] for h in cluster.hosts if h.rank in results),
                          time.monotonic() - started)
