"""Delivering what each host needs, all hosts at once: the direct stream of each host
(into its open session), relays host to host for heavy files several hosts need, and a
second, direct pass for whatever a relay did not deliver.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Sequence, Tuple

from ..errors import ConnectError, MultihostError, SyncError
from ..events import Listener
from ..fanout import Cluster
from .manifest import Entry, Manifest
from .model import HostNeeds, HostSync, merge_result
from ..remote.sync_wire import Writer
from .bulk import openssh_argv, stream_openssh
from .session import HostSession
from .transfer import (ProgressBoard, RelayGroup, file_header, group_for_relay, hop_spec,
                            relay_fanout, stop_process, stream_to, write_entries)


def direct_fill(needs: HostNeeds, code_root: str, entries: Sequence[Entry],
                on_bytes: Callable[[int], None], on_file: Callable[[], None],
                first: bool = True) -> Callable[[Writer], None]:
    """What one host's direct stream holds: the first (deletions, directories, files,
    links, mode and time fixes) or a later one (only the given files)."""
    def fill(writer: Writer) -> None:
        if first:
            # Which paths are ours changes only with additions and deletions (a plan has
            # already noted additions; the fast lane has not): else the host keeps its list.
            changes_ours = bool(needs.added or needs.deletes or needs.dirs)
            writer.record({"t": "begin", "tracked": list(needs.tracked)} if changes_ours
                          else {"t": "begin"})
            for path in needs.deletes:
                writer.record({"t": "x", "p": path})
            for entry in needs.dirs:
                writer.record({"t": "d", "p": entry.path, "m": entry.mode})
        unreadable = write_entries(writer, code_root, entries, on_bytes, on_file)
        if first:
            for entry in needs.meta:
                writer.record(dict(file_header(entry), t="meta"))
        if unreadable:
            raise SyncError(f"cannot read {unreadable[0][0]} here: {unreadable[0][1]}",
                            fix="fix the file's permissions, or ignore it, then sync again")
    return fill


def deliver(cluster: Cluster, manifest: Manifest, needs: Dict[int, HostNeeds],
            sessions: Dict[int, HostSession], emit: Listener
            ) -> Tuple[Dict[int, HostSync], Dict[int, Dict[str, list]]]:
    """Results per host, and each host's stat keys of what it now holds in sync (for
    sync_fastpath's record)."""
    hosts = {h.rank: h for h in cluster.hosts}
    labels = {rank: hosts[rank].label for rank in needs}
    board = ProgressBoard(labels, {r: (n.files, n.bytes) for r, n in needs.items()}, emit)
    relayable = [r for r in needs if not cluster.transport(hosts[r]).is_local]
    relays, _ = group_for_relay({r: n.relayable for r, n in needs.items()}, relayable)
    relayed = {(r, e.path) for g in relays for r in g.ranks for e in g.entries}
    outcomes: Dict[int, List[dict]] = {rank: [] for rank in needs}
    errors: Dict[int, MultihostError] = {}
    lock = threading.Lock()
    started = time.monotonic()
    in_flight: List[object] = []  # every process started here, to end them all on Ctrl-C
    cancelled = threading.Event()

    def register(process) -> None:
        with lock:
            in_flight.append(process)
        if cancelled.is_set():  # started just as everything was being stopped
            stop_process(process)

    def direct_stream(rank: int, entries: Sequence[Entry], first: bool) -> None:
        host_needs = needs[rank]
        fill = direct_fill(host_needs, manifest.root, entries, lambda n: board.add([rank], count=n),
                           lambda: board.add([rank], files=1), first)
        if first and rank in sessions:  # into the session that made the plan
            nodes = sessions[rank].send(fill)
        else:
            nodes = stream_to(cluster.transport(hosts[rank]),
                              {"root": host_needs.root, "rank": rank, "keys": True}, fill,
                              register=register)
        with lock:
            outcomes[rank].append(nodes.get(str(rank), {}))

    def relay_stream(group: RelayGroup) -> None:
        head = hosts[group.ranks[0]]
        hops = [hop_spec(hosts[r], cluster.transport(hosts[r]), needs[r].root) for r in group.ranks]
        request = {"hops": hops, "index": 0, "fanout": relay_fanout(len(hops)), "keys": True}
        transport = cluster.transport(head)

        def fill(writer) -> None:
            write_entries(writer, manifest.root, group.entries,
                          lambda n: board.add(group.ranks, count=n),
                          lambda: board.add(group.ranks, files=1))

        nodes = None
        argv = openssh_argv(transport, cluster.options.config_file)
        if argv is not None:  # the heavy stream through OpenSSH's C crypto (sync_bulk)
            try:
                nodes = stream_openssh(transport, argv, request, fill, register=register)
            except ConnectError:
                nodes = None  # `ssh` would not: paramiko will
        if nodes is None and not cancelled.is_set():
            try:
                nodes = stream_to(transport, request, fill, register=register)
            except MultihostError as err:
                nodes = {str(r): {"error": f"relay via {head.label} failed: {err.cause}"}
                         for r in group.ranks}
        if nodes is None:
            return  # stopped
        with lock:
            for rank in group.ranks:
                node = nodes.get(str(rank)) or {"error": "no answer from the relay"}
                node = dict(node, relayed=True, group=group, head=rank == group.ranks[0])
                outcomes[rank].append(node)

    def guarded(rank: int, task: Callable[[], None]) -> None:
        if cancelled.is_set():
            return
        try:
            task()
        except MultihostError as err:
            with lock:
                errors.setdefault(rank, err)

    pool = ThreadPoolExecutor(max_workers=max(1, min(cluster.workers, len(needs) + len(relays))))
    try:
        jobs = [pool.submit(guarded, rank, lambda r=rank: direct_stream(
                    r, [e for e in needs[r].send if (r, e.path) not in relayed], True))
                for rank in needs]
        jobs += [pool.submit(guarded, group.ranks[0], lambda g=group: relay_stream(g))
                 for group in relays]
        for job in jobs:
            job.result()
        # Second pass: what a relay did not deliver goes directly.
        retry = undelivered(outcomes, errors)
        for rank, entries in retry.items():
            board.extend(rank, len(entries), sum(e.size for e in entries))
        jobs = [pool.submit(guarded, rank, lambda r=rank, e=entries: direct_stream(r, e, False))
                for rank, entries in retry.items()]
        for job in jobs:
            job.result()
    except BaseException:
        # Ctrl-C (or a bug): end every stream now, so the workers return at once; the
        # hosts drop the file they were writing (each file is old or new, never half).
        cancelled.set()
        for session in sessions.values():
            session.abort()
        with lock:
            for process in in_flight:
                stop_process(process)
        raise
    finally:
        pool.shutdown(wait=True)
    seconds = time.monotonic() - started
    results = {}
    for rank, host_needs in needs.items():
        board.add([rank], force=True)
        results[rank] = merge_result(labels[rank], host_needs, outcomes[rank], errors.get(rank),
                                     retry.get(rank, ()), seconds)
    keys: Dict[int, Dict[str, list]] = {}
    for rank in needs:
        merged: Dict[str, list] = {}
        for node in outcomes[rank]:
            merged.update(node.get("keys") or {})
        keys[rank] = merged
    return results, keys


def undelivered(outcomes: Dict[int, List[dict]], errors: Dict[int, MultihostError]) -> Dict[int, List[Entry]]:
    retry: Dict[int, List[Entry]] = {}
    for rank, nodes in outcomes.items():
        if rank in errors:
            continue  # the host itself failed: no point in sending it more
        for node in nodes:
            if not node.get("relayed"):
                continue
            group: RelayGroup = node["group"]
            if node.get("error"):
                retry.setdefault(rank, []).extend(group.entries)
            else:
                failed = {p for p, _ in node.get("errors", [])}
                retry.setdefault(rank, []).extend(e for e in group.entries if e.path in failed)
    return {rank: entries for rank, entries in retry.items() if entries}


