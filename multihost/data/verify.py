"""Data verification (`--data PATH`) and repair (`--sync-data`).

    report = verify_data(cluster, ("/data/coco",))       # never raises for a mismatch
    if not report.ok:
        raise data_error(report)                           # what `run` does
    sync_data(cluster, ("/data/coco",), report=report)     # repair.py: copy from the first host

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
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import MultihostError, and_more
from ..fanout import HostGroup
from ..sync import call_streaming
from ..events import DataProgress, Listener
from .model import DataReport, HostData, PathDiff, PathState, data_error
from ..untrusted import clean_report

# data_error's old home: callers that still import it from here keep working.
__all__ = ["verify_data", "compare_listings", "data_error", "DataProgress", "DataReport",
           "HostData", "PathDiff", "PathState"]

SHOWN = 5


def _scan(transport, paths: Sequence[str], base: Optional[str], verify: bool, listing: bool,
          on_progress: Callable[[dict], None]) -> List[dict]:
    request = {"paths": list(paths), "base": base, "verify": verify, "listing": listing}
    return clean_report(call_streaming(transport, "data.scan", request, b"", on_progress))["paths"]


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


def verify_data(cluster: HostGroup, paths: Sequence[str], *, workdirs: Optional[Dict[int, str]] = None,
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
            error = f"cannot read {path}/{rel}: {text}" + and_more(
                [f"{p}/{r}" for p, r, _ in unreadable[1:]])
            fix = "fix the files' permissions on that host"
        host_diffs = tuple(diffs[rank].get(p) or PathDiff(p, labels[cluster.hosts[0].rank])
                           for p in paths)
        hosts.append(HostData(host.label, rank, host_states, host_diffs, error, fix))
    return DataReport(paths, tuple(hosts), tuple(odd_first), time.monotonic() - started, listings)
