"""The copy behind --sync-data: from the first host to the others, host to host.

For each dataset path that differs: every host that differs first moves the files to be
replaced or removed into its trash (``data_trash``, in parallel), then the first host
pushes the missing and differing files to them, one relay chain per set of hosts that
need the same files, so a dataset missing on seven hosts leaves the first host once.
The chain is the code sync's (sync/relay.py), set up at once: the controller starts a
listening node on every receiving host, and the first host's ``sync.push`` feeds the
head with ``ssh HEAD sync.join``. The controller sends lists and reads replies; no
dataset byte passes it.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from .. import helper
from .model import DataReport, DataSyncReport, HostDataSync, PathState
from .verify import _scan, verify_data
from ..errors import MultihostError, SyncError
from ..fanout import HostGroup
from ..remote.sync.fs import FILE
from ..events import Listener, SyncProgress
from ..sync import call_streaming, hop_spec, pipe_errors_raise
from ..sync.relay import Chain



def _target_root(ref: PathState, state: PathState) -> str:
    """Where a host's copy lives: its dataset path, or for a one-file dataset its dir."""
    if ref.only is None:
        return state.root
    return state.root if state.exists else os.path.dirname(state.root)


class _Tally:
    def __init__(self, cluster: HostGroup):
        self.lock = threading.Lock()
        self.values: Dict[int, Dict[str, object]] = {}
        self.labels = {h.rank: h.label for h in cluster.hosts}

    def add(self, rank: int, **counts) -> None:
        with self.lock:
            entry = self.values.setdefault(rank, {"files": 0, "bytes": 0, "moved_aside": 0,
                                                  "trash": [], "error": None, "fix": None})
            # The first error counts, with its own fix (both set together: setting the
            # error first once kept every fix out).
            if "error" in counts and entry["error"] is None:
                entry["error"], entry["fix"] = counts["error"], counts.get("fix")
            for key, value in counts.items():
                if key == "trash":
                    entry["trash"].append(value)
                elif key not in ("error", "fix"):
                    entry[key] += value

    def results(self) -> Dict[int, HostDataSync]:
        return {rank: HostDataSync(self.labels[rank], rank, v["files"], v["bytes"], v["moved_aside"],
                                   tuple(v["trash"]), v["error"], v["fix"])
                for rank, v in self.values.items()}


def sync_data(cluster: HostGroup, paths: Sequence[str], *, workdirs: Optional[Dict[int, str]] = None,
              listener: Optional[Listener] = None, report: Optional[DataReport] = None) -> DataSyncReport:
    """Copy what differs from the first host to the others, host to host."""
    started = time.monotonic()
    report = report or verify_data(cluster, paths, workdirs=workdirs, listener=listener)
    with pipe_errors_raise():
        results = copy_from_first(cluster, report, listener or (lambda event: None))
    return DataSyncReport(tuple(results[h.rank] for h in cluster.hosts if h.rank in results),
                          time.monotonic() - started)


def copy_from_first(cluster: HostGroup, report: DataReport, emit: Listener) -> Dict[int, HostDataSync]:
    tally = _Tally(cluster)
    first = cluster.hosts[0]
    by_rank = {h.rank: h for h in report.hosts}
    source = by_rank[first.rank]
    if source.error:
        raise SyncError(f"cannot copy data from the first host: {source.error}", host=first.label,
                        fix=source.fix)
    for index, path in enumerate(report.paths):
        ref_state = source.states[index]
        targets = [h for h in report.hosts
                   if h.rank != first.rank and h.error is None and not h.diffs[index].empty]
        if not targets:
            continue
        if not ref_state.exists:
            raise SyncError(f"the first host has no {path} to copy from", host=first.label,
                            fix="put the dataset on the first host, or list a host that has it first")
        if path in report.odd_first:
            raise SyncError(f"the first host's copy of {path} differs from all the others, which "
                            "agree with each other: copying it would spread the damage",
                            host=first.label,
                            fix="repair the dataset on the first host, or list a good host first")
        ref_entries = {e[0]: e for e in report.listings.get((first.rank, path), [])}
        if not ref_entries and ref_state.files:
            ref_entries = {e[0]: e for e in _listing(cluster, first, path)}
        plans: Dict[int, Tuple[List[list], List[str], str]] = {}
        for host in targets:
            state = host.states[index]
            root = _target_root(ref_state, state)
            if not state.exists:
                need, aside = list(ref_entries.values()), []
            else:
                mine = {e[0]: e for e in report.listings.get((host.rank, path), [])}
                need = [e for rel, e in ref_entries.items()
                        if rel not in mine or tuple(mine[rel][1:4]) != tuple(e[1:4])]
                aside = sorted(rel for rel in mine if rel not in ref_entries or
                               tuple(mine[rel][1:4]) != tuple(ref_entries[rel][1:4]))
            plans[host.rank] = (sorted(need), aside, root)
        _move_aside(cluster, plans, tally)
        _push(cluster, first, ref_state, plans, tally, emit)
    return tally.results()


def _listing(cluster: HostGroup, host, path: str) -> list:
    return _scan(cluster.transport(host), (path,), None, False, True, lambda p: None)[0].get("entries", [])


def _move_aside(cluster: HostGroup, plans, tally: _Tally) -> None:
    def move(host, transport):
        _, aside, root = plans[host.rank]
        if not aside:
            return None
        return helper.call(transport, "data.trash", {"root": root},
                           input=json.dumps(aside).encode("utf-8", "surrogateescape"), timeout=None)

    hosts = [h for h in cluster.hosts if h.rank in plans]
    for result in cluster.map(move, hosts):
        rank = result.host.rank
        if not result.ok:
            tally.add(rank, error=result.error.cause, fix=result.error.fix)
        elif result.value:
            tally.add(rank, moved_aside=result.value["moved"])
            if result.value.get("trash"):
                tally.add(rank, trash=result.value["trash"])
            if result.value.get("errors"):
                rel, text = result.value["errors"][0]
                tally.add(rank, error=f"cannot move {rel} aside: {text}",
                          fix="move or remove it by hand, then run --sync-data again")


def _push(cluster: HostGroup, first, ref_state: PathState, plans, tally: _Tally, emit: Listener) -> None:
    """One push from the first host per distinct set of needed files."""
    groups: Dict[Tuple[str, ...], List[int]] = {}
    for rank, (need, _, _) in plans.items():
        if need and tally.values.get(rank, {}).get("error") is None:
            groups.setdefault(tuple(e[0] for e in need), []).append(rank)
    for ranks in groups.values():
        ranks.sort()
        _push_chain(cluster, first, ref_state, plans, ranks, tally, emit)


def _push_chain(cluster: HostGroup, first, ref_state: PathState, plans, ranks: List[int],
                tally: _Tally, emit: Listener) -> None:
    """The first host feeds one chain of ``ranks``, whose nodes the controller starts on
    every one of them at once; each node answers here for itself."""
    hosts = {h.rank: h for h in cluster.hosts}
    chained = [hosts[r] for r in ranks]
    transports = [cluster.transport(h) for h in chained]
    need = plans[ranks[0]][0]
    total = (len(need), sum(e[2] for e in need))
    hops = [hop_spec(h, t, plans[h.rank][2], op="sync.join") for h, t in zip(chained, transports)]
    files = [[e[0], e[2], e[4], e[5], e[3]] if e[1] == FILE else [e[0], "l", e[3]] for e in need]
    payload = json.dumps(files).encode("utf-8", "surrogateescape")
    root = ref_state.root  # a one-file dataset's directory, or the dataset itself
    fed: Dict[str, object] = {}

    def progress(sent) -> None:
        for rank in ranks:
            emit(SyncProgress(hosts[rank].label, rank, 0, total[0], int(sent), total[1]))

    def feed(spec: dict) -> dict:
        try:
            result = call_streaming(cluster.transport(first), "sync.push",
                                    {"root": root, "relay": spec}, payload, progress)
        except MultihostError as err:
            fed["fix"] = err.fix
            return {str(r): {"error": f"copy from {first.label} failed: {err.cause}"}
                    for r in ranks}
        fed["source_errors"] = result.get("source_errors") or []
        nodes = result.get("nodes")
        return nodes if isinstance(nodes, dict) else {}

    chain = Chain(transports, [h.label for h in chained], ranks, hops,
                  {r: plans[r][2] for r in ranks}, lambda process: None, fed=True, keys=False)
    nodes = chain.run(feed)
    if fed.get("source_errors"):
        rel, text = fed["source_errors"][0]
        for rank in ranks:
            tally.add(rank, error=f"cannot read {rel} on {first.label}: {text}",
                      fix="fix the file on the first host, then run --sync-data again")
    for rank in ranks:
        node = nodes.get(str(rank)) or {"error": "no answer from the relay"}
        if node.get("error"):
            tally.add(rank, error=node["error"], fix=fed.get("fix") or (
                f"let {first.label} and the other hosts ssh to {hosts[rank].label} without a "
                "password (the hosts' keys and known_hosts), then run --sync-data again"))
            continue
        tally.add(rank, files=node.get("files", 0) + node.get("links", 0),
                  bytes=node.get("bytes", 0))
        if node.get("errors"):
            rel, text = node["errors"][0]
            tally.add(rank, error=f"{rel}: {text}", fix="fix the cause on the host, then run "
                                                        "--sync-data again")
