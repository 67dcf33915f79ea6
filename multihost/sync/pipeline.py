"""`multihost sync`: make the code directory identical in every host's workdir.

    report = sync_code(cluster, ".", workdirs={h.rank: workdir_for(h) for h in hosts})

1. The controller builds its manifest (manifest.py) while it connects to every host.
2. A host left exactly as its last sync left it is recognised with one `stat` command
   (fastpath.py), through the OpenSSH master an earlier command left when there is
   one: then it is done, or, for a small change, gets the change at once by the
   helper's stream.
3. Any other host compares the manifest with its tree by content: one helper process
   per host (session.py) answers the plan from its hash cache and stays to receive
   (compare.py: the plans, and what follows them).
4. What differs travels: one stream per host, plus relays host to host for heavy files
   several hosts need (deliver.py, transfer.py, bulk.py). Files removed here that
   a sync had put there are removed on the host; nothing else there is touched.

All hosts are worked on in parallel and every host is attempted. A host that failed is
reported, and SyncError is raised at the end (with the report attached).
The engine only emits events (SyncPlanned, SyncProgress, SyncHostDone): views render.
"""
from __future__ import annotations

import functools
import os
import secrets
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Tuple

from ..errors import MultihostError, RemoteError
from ..events import Listener, SyncHostDone, SyncPlanned, SyncScanned, SyncWaiting
from ..fanout import HostGroup, fan_out
from ..machines import by_address, refuse_repeats
from ..transport.base import pipe_errors_raise
from .compare import compare_and_send, remember_synced
from .deliver import direct_fill
from .fastpath import (adopt_record, host_unchanged, load_record, matches_manifest,
                       plan_from_record, remember_check, unchanged_keys)
from .manifest import Manifest, build_manifest, code_revision, size_warnings
from .model import (HostNeeds, HostSync, SyncReport, failed_result, merge_result,
                    needs_from_plan, sync_error)
from .session import HostSession
from .recorded import Looked, look_first, nothing_to_write
from .shared import (find_sharing, forget_tokens, one_writer_each, remember_shared,
                     shared_before)
from ..remote.sync.lock import STALE
from .transfer import RELAY_MIN_BYTES, stream_to

__all__ = ["sync_code"]

# Seconds for a `stat` through a reused connection (100k files: ~1 s): a master that
# does not answer by then is left for the paramiko path, not waited for.
THROUGH_MASTER = 5.0
# Seconds a host's helper waits for another sync of the same workdir to end before
# this sync is refused there (remote/sync/lock.py); a run's hold is never waited for.
WAIT_ENV, WAIT_DEFAULT = "MULTIHOST_SYNC_WAIT", 60.0


def new_claim() -> dict:
    """What every helper of this sync shows the hosts' locks: one id for all of them
    (they join each other), and how a refused writer will name it."""
    try:
        wait = max(0.0, float(os.environ.get(WAIT_ENV, WAIT_DEFAULT)))
    except ValueError:
        wait = WAIT_DEFAULT
    return {"id": "sync:" + secrets.token_hex(8), "kind": "sync", "wait": wait, "born": time.time(),
            "what": f"multihost sync from {socket.gethostname()} (controller pid {os.getpid()})"}


@dataclass(frozen=True)
class _Known:
    """A host found exactly as the last sync left it (fastpath.py)."""

    record: dict
    needs: Optional[HostNeeds] = None     # None: nothing to do
    nodes: Optional[dict] = None          # the reply of the stream already sent to it
    seconds: float = 0.0
    plan: Optional[dict] = None           # the plan worked out from its record


def sync_code(cluster: HostGroup, code_dir: str, *, workdirs: Dict[int, str], dry_run: bool = False,
              verify: bool = False, listener: Optional[Listener] = None) -> SyncReport:
    """Make ``code_dir`` identical in every host's workdir; see the module's doc."""
    # One workdir of one machine under two names, before any host is reached (two
    # workdirs of one machine are two trees: a local test syncs both).
    refuse_repeats(cluster.hosts, {rank: f"{where}|{workdirs[rank]}" if where else None
                                   for rank, where in by_address(cluster.hosts).items()})
    with pipe_errors_raise():
        if dry_run or len(cluster.hosts) < 2:
            return _sync_code(cluster, code_dir, workdirs, dry_run, verify, listener)
        looked, manifest = look_first(cluster, code_dir, workdirs, THROUGH_MASTER, verify)
        if nothing_to_write(cluster, looked, manifest):   # who shares what matters not
            return _CodeSync(cluster, code_dir, workdirs, False, verify, listener,
                             looked=looked, manifest=manifest).run()
        tokens: List[threading.Thread] = []
        head = min(cluster.hosts, key=lambda h: h.rank)

        def probe():
            sharing = find_sharing(cluster, workdirs)
            tokens.append(forget_tokens(cluster, workdirs, sharing))
            remember_shared(head.label, workdirs[head.rank],
                            any(head.rank in group for group in sharing.groups))
            return sharing
        # A host that shares another's workdir is checked after that one wrote it, and
        # not by its record (writers given): it is that writer's.
        try:
            return one_writer_each(cluster, probe, workdirs, lambda part, writers: _CodeSync(
                part, code_dir, workdirs, False, verify, listener, writers,
                looked={} if writers else looked, manifest=manifest).run(), functools.partial(
                    _adopt, cluster, workdirs, os.path.abspath(os.path.expanduser(code_dir))),
                early=shared_before(head.label, workdirs[head.rank])
                or manifest.result().bytes < RELAY_MIN_BYTES)
        finally:
            for thread in tokens:
                thread.join(60)


def _adopt(cluster: HostGroup, workdirs: Dict[int, str], code_root: str, rank: int,
           checker: int) -> None:
    labels = {h.rank: h.label for h in cluster.hosts}
    adopt_record(labels[checker], labels[rank], workdirs[rank], code_root)


def _sync_code(cluster: HostGroup, code_dir: str, workdirs: Dict[int, str], dry_run: bool,
               verify: bool, listener: Optional[Listener]) -> SyncReport:
    return _CodeSync(cluster, code_dir, workdirs, dry_run, verify, listener).run()


class _CodeSync:
    """One sync of the code directory. Its steps are the methods; what they share (the
    manifest once built, the way each host was reached, the results so far) is kept on
    the instance, filled in the order ``run`` calls them."""

    def __init__(self, cluster: HostGroup, code_dir: str, workdirs: Dict[int, str],
                 dry_run: bool, verify: bool, listener: Optional[Listener],
                 writers: Optional[Dict[int, str]] = None, looked: Optional[Looked] = None,
                 manifest: Optional["Future[Manifest]"] = None):
        self.cluster = cluster
        self.looked = looked or {}     # hosts checked by `stat` already (recorded.py)
        self.built = manifest          # being built already (recorded.py)
        # Hosts whose workdir another host of this sync has just written (they share it):
        # rank -> that host's label.
        self.writers = writers or {}
        self.code_dir = code_dir
        self.workdirs = workdirs
        self.dry_run = dry_run
        self.verify = verify
        self.emit: Listener = listener or _ignore
        self.started = time.monotonic()
        self.claim = new_claim()
        self.waits: Dict[int, str] = {}               # hosts whose helper waited, and for what
        self.code_root = os.path.abspath(os.path.expanduser(code_dir))
        self.ready = threading.Event()              # set once the manifest is built (or failed)
        self.manifest: Optional[Manifest] = None
        self.results: Dict[int, HostSync] = {}
        self.sessions: Dict[int, HostSession] = {}
        self.known: Dict[int, _Known] = {}
        self.keys: Dict[int, Dict[str, list]] = {}
        # Hosts last synced from the same manifest have the same plan (but for their root):
        # worked out once, not once per host.
        self.plans: Dict[Optional[str], dict] = {}
        self.needs: Dict[Optional[str], HostNeeds] = {}
        self.plans_lock = threading.Lock()
        # Hosts reached by a new connection, to be left an OpenSSH master for the next
        # command's quick checks: started once the files are delivered, not beside them
        # (at 64 hosts, 64 handshakes would take the CPU a first sync's bytes need).
        self.to_leave: List = []

    def run(self) -> SyncReport:
        # Connect and check or start every host while the code is hashed here.
        starting: List = []
        connecting = _in_background(lambda: starting.extend(
            fan_out(self.cluster.hosts, self.begin, self.cluster.workers)))
        revision: List[Tuple[Optional[str], bool]] = []
        git = _in_background(lambda: revision.append(code_revision(self.code_dir)))
        manifest = self.scan(connecting, starting)
        connecting.join()
        for result in starting:
            self.sort_out(result)
        pending = {rank: k.needs for rank, k in self.known.items()
                   if k.needs is not None and k.nodes is None}
        try:
            self.keys.update(compare_and_send(self.cluster, manifest, self.sessions, pending,
                                              self.results, self.dry_run, self.emit,
                                              self.claims(), self.waits,
                                              {rank: (item.record.get("machine"),
                                                      item.record.get("root"))
                                               for rank, item in self.known.items()}))
        finally:
            for session in self.sessions.values():
                session.abort()
        self.add_unchanged_keys(manifest)
        if not self.dry_run:
            remember_synced(self.cluster, manifest, self.workdirs, self.code_root,
                            self.results, self.keys)
        self.leave_connections()
        git.join()
        return self.report(manifest, revision[0] if revision else (None, False))

    def claims(self) -> Dict[int, dict]:
        """Each host's claim for the helpers that write it; a host found as recorded
        carries the generation its check saw: nobody may have written since."""
        claims = {h.rank: self.claim for h in self.cluster.hosts}
        for rank, item in self.known.items():
            claims[rank] = dict(self.claim, gen=item.record.get("gen", "-"))
        return claims

    def begin(self, host):
        """A host exactly as the last sync left it needs no helper to be compared (see
        fastpath.py), through the OpenSSH master an earlier command left when there is
        one (no handshake); any other host gets its helper started right away, to
        compare by content."""
        found = self.looked.get(host.rank)
        if found is not None:
            return self.as_looked(host, found)
        record = None
        if host.rank in self.writers and not self.verify:
            # Its workdir is the one its writer just synced: the writer's record (every
            # file's size, times and inode as written) is checked here by one `stat`.
            record = load_record(self.writers[host.rank], self.workdirs[host.rank],
                                 self.code_root)
        if record is None and not self.verify:
            record = load_record(host.label, self.workdirs[host.rank], self.code_root)
        quick = None if record is None else self.cluster.reused(host)
        if quick is not None:
            try:
                if host_unchanged(quick, record, THROUGH_MASTER):
                    return self.as_known(host, quick, record)
            except MultihostError:
                pass  # the master went away half-way: the full path below redoes it
        transport = self.cluster.transport(host)
        self.to_leave.append(host)
        # Through a master, a host not as recorded was asked already: compare by content.
        if record is None or quick is not None or not host_unchanged(transport, record):
            return self.start_session(host, transport)
        return self.as_known(host, transport, record)

    def as_looked(self, host, found):
        """A host whose record was checked before this sync began (recorded.py)."""
        transport = None if found is False else self.cluster.reused(host)
        if transport is None:
            transport = self.cluster.transport(host)
            self.to_leave.append(host)
        if found is False:   # not as recorded: compare by content
            return self.start_session(host, transport)
        return self.as_known(host, transport, found)

    def leave_connections(self) -> None:
        for host in self.to_leave:
            self.cluster.leave_connection(host)

    def start_session(self, host, transport) -> HostSession:
        request = {"root": self.workdirs[host.rank], "verify": self.verify,
                   "dry_run": self.dry_run, "rank": host.rank, "keys": not self.dry_run,
                   "written": host.rank in self.writers}
        if not self.dry_run:
            request["claim"] = self.claim
        session = HostSession.start(transport, request)
        session.on_wait = lambda text: self.emit(SyncWaiting(host.label, text))
        return session

    def as_known(self, host, transport, record) -> _Known:
        """A host as the last sync left it: what changed since (from its record), sent
        at once when it is small."""
        self.ready.wait()
        manifest = self.manifest
        if manifest is None or matches_manifest(record, manifest):
            return _Known(record)
        plan, needs = self.needs_for(host, record, manifest)
        if self.dry_run or needs.bytes >= RELAY_MIN_BYTES:
            # Heavy: sent with the others (relays may serve).
            return _Known(record, needs, plan=plan)
        began = time.monotonic()
        claim = dict(self.claim, gen=record.get("gen", "-"))
        try:
            nodes = _stream_small_change(transport, host, needs, manifest, claim)
        except RemoteError as err:
            if STALE not in err.cause:
                raise
            # Another sync wrote it between the check and this stream: compare by content.
            return self.start_session(host, self.cluster.transport(host))
        self.emit(SyncPlanned(host.label, needs))
        return _Known(record, needs, nodes, time.monotonic() - began, plan)

    def needs_for(self, host, record: dict, manifest: Manifest) -> Tuple[dict, HostNeeds]:
        """The plan and needs of a host as its record says: the same (but for rank and
        root) for every host last synced from the same manifest, so worked out once."""
        plan = self.plan_for(record, manifest)
        key = record.get("digest")
        # Worked out under the lock: at 64 hosts, the hosts that came while the first
        # worked it out would each work it out again, all of them holding up their writes.
        with self.plans_lock:
            shared = self.needs.get(key) if key else None
            if shared is None:
                shared = needs_from_plan(manifest, host.rank, plan)
                if key:
                    self.needs[key] = shared
        return plan, replace(shared, rank=host.rank, root=plan["root"])

    def plan_for(self, record: dict, manifest: Manifest) -> dict:
        key = record.get("digest")
        with self.plans_lock:
            plan = self.plans.get(key) if key else None
            if plan is None:
                plan = self.plans[key] = plan_from_record(record, manifest)
        return dict(plan, root=record["root"])

    def scan(self, connecting: threading.Thread, starting: List) -> Manifest:
        """The manifest of the code directory; if it cannot be built, the sessions
        started meanwhile are ended before the error goes on."""
        try:
            manifest = self.built.result() if self.built is not None else build_manifest(
                self.code_dir, verify=self.verify)
        except BaseException:
            self.ready.set()
            connecting.join()
            for result in starting:
                if result.ok and not isinstance(result.value, _Known):
                    result.value.abort()
            raise
        self.manifest = manifest
        self.ready.set()
        self.emit(SyncScanned(manifest.files, manifest.bytes, manifest.hashed_files,
                              manifest.hashed_bytes, time.monotonic() - self.started))
        return manifest

    def sort_out(self, result) -> None:
        """One host's start: failed, a session waiting for the manifest, or known."""
        host = result.host
        if not result.ok:
            self.results[host.rank] = failed_result(host.label, host.rank, result.error)
        elif not isinstance(result.value, _Known):
            self.sessions[host.rank] = result.value
        else:
            self.known[host.rank] = item = result.value
            if item.needs is None:
                self.results[host.rank] = HostSync(host.label, host.rank, item.record["root"])
                remember_check(host.label, self.workdirs[host.rank], self.code_root, item.record)
            elif item.nodes is not None:
                node = item.nodes.get(str(host.rank), {})
                self.results[host.rank] = merge_result(host.label, item.needs, [node], None, (),
                                                       item.seconds)
                self.keys[host.rank] = dict(node.get("keys") or {})

    def add_unchanged_keys(self, manifest: Manifest) -> None:
        """What the stream left alone on a known host is as its record says."""
        for rank, item in self.known.items():
            if item.needs is not None and item.needs.empty and rank in self.results \
                    and not self.dry_run:
                self.keys.setdefault(rank, {})
            if rank in self.keys and item.needs is not None:
                plan = item.plan or self.plan_for(item.record, manifest)
                self.keys[rank] = {**unchanged_keys(item.record, plan), **self.keys[rank]}

    def report(self, manifest: Manifest, revision: Tuple[Optional[str], bool]) -> SyncReport:
        commit, dirty = revision
        for rank, note in self.waits.items():
            if rank in self.results:
                self.results[rank] = replace(self.results[rank],
                                             notes=(note,) + self.results[rank].notes)
        report = SyncReport(manifest.root, manifest.files, manifest.bytes,
                            tuple(self.results[h.rank] for h in self.cluster.hosts), commit, dirty,
                            self.dry_run, self.verify, size_warnings(manifest),
                            time.monotonic() - self.started)
        for host_result in report.hosts:
            self.emit(SyncHostDone(host_result))
        if not report.ok:
            raise sync_error(report)
        return report


def _in_background(work: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def _stream_small_change(transport, host, needs: HostNeeds, manifest: Manifest,
                         claim: dict) -> dict:
    return stream_to(transport, {"root": needs.root, "rank": host.rank, "keys": True,
                                 "claim": claim},
                     direct_fill(needs, manifest.root, needs.send, _ignore, _ignore, part=[1, 1]))


def _ignore(*args) -> None:
    pass

