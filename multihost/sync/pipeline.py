"""`multihost sync`: make the code directory identical in every host's workdir.

    report = sync_code(cluster, ".", workdirs={h.rank: workdir_for(h) for h in hosts})

1. The controller builds its manifest (sync_manifest) while it connects to every host.
2. A host left exactly as its last sync left it is recognised with one `stat` command
   (sync_fastpath), through the OpenSSH connection an earlier command left when there is
   one: then it is done, or, for a small change, gets the change at once (written by
   its shell when it is new content for a few files, sync_quick; else by the helper).
3. Any other host compares the manifest with its tree by content: one helper process
   per host (sync_session) answers the plan from its hash cache and stays to receive.
4. What differs travels: one stream per host, plus relays host to host for heavy files
   several hosts need (sync_deliver, sync_transfer, sync_bulk). Files removed here that
   a sync had put there are removed on the host; nothing else there is touched.

All hosts are worked on in parallel and every host is attempted. A host that failed is
reported, and SyncError is raised at the end (with the report attached).
The engine only emits events (SyncPlanned, SyncProgress, SyncHostDone): views render.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ..errors import MultihostError
from ..events import Listener, SyncHostDone, SyncPlanned, SyncProgress, SyncScanned
from ..fanout import Cluster, fan_out
from .manifest import Manifest, build_manifest, code_revision, size_warnings
from .model import (HostNeeds, HostSync, SyncReport, dry_result, failed_result, merge_result, needs_from_plan, sync_error)
from .fastpath import (forget_record, host_digest, host_unchanged, load_record,
                            matches_manifest, plan_from_record, remember_check, save_record,
                            unchanged_keys)
from .quick import quick_send
from .transfer import RELAY_MIN_BYTES, pipe_errors_raise, stream_to

if TYPE_CHECKING:
    from .session import HostSession
    from ..transport import Transport

# What a sync that finds nothing (or little) to do never needs is imported where it is
# used (sync_session, sync_deliver): a no-change sync is mostly Python's own start-up.
__all__ = ["sync_code", "code_revision", "SyncReport", "HostSync", "HostNeeds", "SyncPlanned",
           "SyncProgress", "SyncHostDone", "SyncScanned"]

QUICK_TIMEOUT = 5.0   # seconds for a `stat` through a reused connection (100k files: ~1 s)


def _same_tree(transport, code_root: str, remote_root: str) -> bool:
    """A host that is this machine with its workdir on the code directory: nothing to do."""
    return transport.is_local and os.path.realpath(remote_root) == os.path.realpath(code_root)


@dataclass(frozen=True)
class _Known:
    """A host found exactly as the last sync left it (sync_fastpath)."""

    record: dict
    needs: Optional[HostNeeds] = None     # None: nothing to do
    nodes: Optional[dict] = None          # the reply of the stream already sent to it
    seconds: float = 0.0


def sync_code(cluster: Cluster, code_dir: str, *, workdirs: Dict[int, str], dry_run: bool = False,
              verify: bool = False, listener: Optional[Listener] = None) -> SyncReport:
    """Make ``code_dir`` identical in every host's workdir; see the module's doc."""
    with pipe_errors_raise():
        return _sync_code(cluster, code_dir, workdirs, dry_run, verify, listener)


def _sync_code(cluster: Cluster, code_dir: str, workdirs: Dict[int, str], dry_run: bool,
               verify: bool, listener: Optional[Listener]) -> SyncReport:
    emit = listener or (lambda event: None)
    started = time.monotonic()
    code_root = os.path.abspath(os.path.expanduser(code_dir))
    ready = threading.Event()
    built: Dict[str, Manifest] = {}
    used: Dict[int, Transport] = {}     # the way each host was reached (for _record)

    def start_session(host, transport) -> HostSession:
        from .session import HostSession

        return HostSession.start(transport, {"root": workdirs[host.rank], "verify": verify,
                                             "dry_run": dry_run, "rank": host.rank,
                                             "keys": not dry_run})

    def begin(host):
        """A host exactly as the last sync left it needs no helper to be compared (one
        `stat`, see sync_fastpath), through the OpenSSH master an earlier command left
        when there is one (no handshake), and a small change goes to it at once; any
        other host gets its helper started right away, to compare by content."""
        record = None if verify else load_record(host.label, workdirs[host.rank], code_root)
        quick = None if record is None else cluster.reused(host)
        # Through a master, a host that does not answer within seconds is left to the
        # paramiko path (its connect timeout, its error), not waited for.
        if quick is not None and host_unchanged(quick, record, QUICK_TIMEOUT):
            used[host.rank] = quick
            try:
                return as_known(host, quick, record)
            except MultihostError:
                pass  # the master went away half-way: the full path below redoes it
        transport = used[host.rank] = cluster.transport(host)
        cluster.leave_connection(host)
        if record is None or quick is not None or not host_unchanged(transport, record):
            return start_session(host, transport)
        return as_known(host, transport, record)

    def as_known(host, transport, record) -> _Known:
        ready.wait()
        manifest = built.get("manifest")
        if manifest is None or matches_manifest(record, manifest):
            return _Known(record)
        needs = needs_from_plan(manifest, host.rank, plan_from_record(record, manifest))
        if dry_run or needs.bytes >= RELAY_MIN_BYTES:
            return _Known(record, needs)  # heavy: sent with the others (relays may serve)
        emit(SyncPlanned(host.label, needs))
        began = time.monotonic()
        try:
            nodes = quick_send(transport, needs, record, manifest.root)
        except MultihostError:
            nodes = None  # the helper's stream below redoes it, whatever got written
        if nodes is None:
            from .deliver import direct_fill

            nodes = stream_to(transport, {"root": needs.root, "rank": host.rank, "keys": True},
                              direct_fill(needs, manifest.root, needs.send, _ignore, _ignore))
        return _Known(record, needs, nodes, time.monotonic() - began)

    # Connect and check or start every host while the code is hashed here.
    starting: List = []
    connecting = threading.Thread(target=lambda: starting.extend(fan_out(cluster.hosts, begin,
                                                                            cluster.workers)),
                                  daemon=True)
    connecting.start()
    revision: List[Tuple[Optional[str], bool]] = []
    git = threading.Thread(target=lambda: revision.append(code_revision(code_dir)), daemon=True)
    git.start()
    try:
        manifest = build_manifest(code_dir, verify=verify)
    except BaseException:
        ready.set()
        connecting.join()
        for result in starting:
            if result.ok and not isinstance(result.value, _Known):
                result.value.abort()
        raise
    built["manifest"] = manifest
    ready.set()
    emit(SyncScanned(manifest.files, manifest.bytes, manifest.hashed_files, manifest.hashed_bytes,
                     time.monotonic() - started))
    connecting.join()

    results: Dict[int, HostSync] = {}
    sessions: Dict[int, HostSession] = {}
    known: Dict[int, _Known] = {}
    keys: Dict[int, Dict[str, list]] = {}
    digests: Dict[int, str] = {}
    for result in starting:
        host = result.host
        if not result.ok:
            results[host.rank] = failed_result(host.label, host.rank, result.error)
        elif not isinstance(result.value, _Known):
            sessions[host.rank] = result.value
        else:
            known[host.rank] = item = result.value
            if item.needs is None:
                results[host.rank] = HostSync(host.label, host.rank, item.record["root"])
                remember_check(host.label, workdirs[host.rank], code_root, item.record)
            elif item.nodes is not None:
                node = item.nodes.get(str(host.rank), {})
                results[host.rank] = merge_result(host.label, item.needs, [node], None, (), item.seconds)
                keys[host.rank] = dict(node.get("keys") or {})
                if node.get("stat"):
                    digests[host.rank] = node["stat"]
    pending = {rank: k.needs for rank, k in known.items() if k.needs is not None and k.nodes is None}
    try:
        keys.update(_compare_and_send(cluster, manifest, sessions, pending, results, dry_run, emit))
    finally:
        for session in sessions.values():
            session.abort()
    for rank, item in known.items():  # what the stream left alone is as recorded
        if item.needs is not None and item.needs.empty and rank in results and not dry_run:
            keys.setdefault(rank, {})
        if rank in keys and item.needs is not None:
            plan = plan_from_record(item.record, manifest)
            keys[rank] = {**unchanged_keys(item.record, manifest, plan), **keys[rank]}
    if not dry_run:
        _record(cluster, manifest, workdirs, code_root, results, keys, digests, used)
    git.join()
    commit, dirty = revision[0] if revision else (None, False)
    report = SyncReport(manifest.root, manifest.files, manifest.bytes,
                        tuple(results[h.rank] for h in cluster.hosts), commit, dirty, dry_run,
                        verify, size_warnings(manifest), time.monotonic() - started)
    for host_result in report.hosts:
        emit(SyncHostDone(host_result))
    if not report.ok:
        raise sync_error(report)
    return report


def _ignore(*args) -> None:
    pass


def _compare_and_send(cluster: Cluster, manifest, sessions: Dict[int, HostSession],
                      known: Dict[int, HostNeeds], results: Dict[int, HostSync], dry_run: bool,
                      emit: Listener) -> Dict[int, Dict[str, list]]:
    """Each session's plan, then what differs (with what ``known`` hosts need); fills
    ``results``, returns the hosts' stat keys of what is in sync."""
    payload = manifest.encode() if sessions else b""
    needs: Dict[int, HostNeeds] = dict(known)
    for rank, host_needs in known.items():
        emit(SyncPlanned(cluster.hosts[rank].label, host_needs))
    planned_hosts = [h for h in cluster.hosts if h.rank in sessions]
    for planned in cluster.map(lambda host, t: sessions[host.rank].plan(payload), planned_hosts):
        host = planned.host
        if not planned.ok:
            results[host.rank] = failed_result(host.label, host.rank, planned.error)
            continue
        host_needs = needs_from_plan(manifest, host.rank, planned.value)
        if _same_tree(cluster.transport(host), manifest.root, host_needs.root):
            results[host.rank] = HostSync(host.label, host.rank, host_needs.root,
                                          notes=("the workdir is the code directory itself",))
            continue
        needs[host.rank] = host_needs
        emit(SyncPlanned(host.label, host_needs))
    busy = {} if dry_run else {rank: n for rank, n in needs.items() if not n.empty}
    for rank in needs.keys() - busy.keys():
        label = cluster.hosts[rank].label
        results[rank] = dry_result(label, needs[rank]) if dry_run else \
            merge_result(label, needs[rank], [], None, (), 0.0)
    # Already identical (or a dry run): end those sessions now; they answer their keys.
    idle = [h for h in cluster.hosts if h.rank in sessions and h.rank not in busy]
    keys: Dict[int, Dict[str, list]] = {}
    for closed in cluster.map(lambda host, t: sessions[host.rank].close(), idle):
        if closed.ok:
            keys[closed.host.rank] = closed.value.get(str(closed.host.rank), {}).get("keys") or {}
    if busy:
        from .deliver import deliver

        delivered, more_keys = deliver(cluster, manifest, busy, sessions, emit)
        results.update(delivered)
        keys.update(more_keys)
    return keys


def _record(cluster: Cluster, manifest, workdirs: Dict[int, str], code_root: str,
            results: Dict[int, HostSync], keys: Dict[int, Dict[str, list]],
            digests: Dict[int, str], used: Dict[int, Transport]) -> None:
    """Remember each fully synced host's state for the next sync's fast path, with the
    hash of its `stat` answer (asked for here when the sync did not bring it back)."""
    synced = [h for h in cluster.hosts if h.rank in keys and results.get(h.rank) is not None
              and results[h.rank].ok and not results[h.rank].kept]
    asked = fan_out([h for h in synced if h.rank not in digests], lambda host: host_digest(
        used.get(host.rank) or cluster.transport(host), results[host.rank].root, manifest,
        keys[host.rank]), cluster.workers)
    digests = {**digests, **{a.host.rank: a.value for a in asked if a.ok and a.value}}
    for host in cluster.hosts:
        if host in synced:
            save_record(host.label, workdirs[host.rank], code_root, results[host.rank].root,
                        manifest, keys[host.rank], digests.get(host.rank))
        elif host.rank in keys:
            forget_record(host.label, workdirs[host.rank], code_root)
