"""Delivering what each host needs, all hosts at once: the direct stream of each host
(into its open session), relays host to host for heavy files several hosts need, and a
second, direct pass for whatever a relay did not deliver.
"""
from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import ConnectError, MultihostError, SyncError
from ..events import Listener
from ..fanout import HostGroup
from .manifest import Entry, Manifest
from .model import HostNeeds, HostSync, merge_result
from ..remote.sync.wire import Writer
from .bulk import openssh_argv, stream_openssh
from .session import HostSession
from .relay import Chain, head_failure
from .transfer import (ProgressBoard, RelayGroup, file_header, group_for_relay, hop_spec,
                       stop_process, stream_to, write_entries)


def direct_fill(needs: HostNeeds, code_root: str, entries: Sequence[Entry],
                on_bytes: Callable[[int], None], on_file: Callable[[], None],
                first: bool = True, tracked: Optional[bool] = None,
                dirs: Optional[bool] = None,
                part: Optional[list] = None) -> Callable[[Writer], None]:
    """What one host's direct stream holds: the first (deletions, directories, files,
    links, mode and time fixes) or a later one (only the given files). ``tracked`` and
    ``dirs``: whether it carries the list of paths the sync owns (default: a first stream
    that changes it) and the directories (default: a first stream), when a relay does.
    ``part``: [pass, streams of that pass to the host]: the last one of them to end
    whole unmarks the host's tree (remote/sync/lock.py)."""
    if tracked is None:
        tracked = first and changes_owned(needs)
    if dirs is None:
        dirs = first

    def fill(writer: Writer) -> None:
        writer.record({"t": "begin", "part": part} if part else {"t": "begin"})
        if tracked:
            writer.tracked(needs.tracked)
        if first:
            for path in needs.deletes:
                writer.record({"t": "x", "p": path})
        if dirs:
            write_dirs(writer, needs.dirs)
        unreadable = write_entries(writer, code_root, entries, on_bytes, on_file)
        if first:
            for entry in needs.meta:
                writer.record(dict(file_header(entry), t="meta"))
        if unreadable:
            raise SyncError(f"cannot read {unreadable[0][0]} here: {unreadable[0][1]}",
                            fix="fix the file's permissions, or ignore it, then sync again")
    return fill


def write_dirs(writer: Writer, dirs: Sequence[Entry]) -> None:
    """Directories come before what goes into them; the receiver gives each its mode
    once everything is written (``finish_dir``)."""
    for entry in dirs:
        writer.record({"t": "d", "p": entry.path, "m": entry.mode})


def changes_owned(needs: HostNeeds) -> bool:
    """Which paths are ours changes only with additions and deletions (a plan has already
    noted additions; the fast lane has not): else the host keeps its list."""
    return bool(needs.added or needs.deletes or needs.dirs)


def deliver(cluster: HostGroup, manifest: Manifest, needs: Dict[int, HostNeeds],
            sessions: Dict[int, HostSession], emit: Listener,
            claims: Optional[Dict[int, dict]] = None
            ) -> Tuple[Dict[int, HostSync], Dict[int, Dict[str, list]]]:
    """Results per host, and each host's stat keys of what it now holds in sync (for
    fastpath.py's record). ``claims``: what each host's helpers show its workdir's
    lock (remote/sync/lock.py)."""
    return _Delivery(cluster, manifest, needs, sessions, emit, claims or {}).run()


class _Delivery:
    """One delivery to every host at once. Its streams run in worker threads and share
    what is kept here, under ``lock``: what each host answered, the first error of each,
    and every process started (to end them all on Ctrl-C)."""

    def __init__(self, cluster: HostGroup, manifest: Manifest, needs: Dict[int, HostNeeds],
                 sessions: Dict[int, HostSession], emit: Listener, claims: Dict[int, dict]):
        self.cluster = cluster
        self.claims = claims
        self.manifest = manifest
        self.needs = needs
        self.sessions = sessions
        self.hosts = {h.rank: h for h in cluster.hosts}
        self.labels = {rank: self.hosts[rank].label for rank in needs}
        self.board = ProgressBoard(self.labels, {r: (n.files, n.bytes) for r, n in needs.items()},
                                   emit)
        relayable = [r for r in needs if not cluster.transport(self.hosts[r]).is_local]
        self.relays, _ = group_for_relay({r: n.relayable for r, n in needs.items()}, relayable)
        self.relayed = {(r, e.path) for g in self.relays for r in g.ranks for e in g.entries}
        # The list of paths the sync owns is the manifest's, the same for every host: a
        # relay whose hosts all take a new one and delete nothing (so keep nothing back:
        # a first sync) carries it once for all of them, and their own streams do not.
        self.listing = [g for g in self.relays
                        if all(changes_owned(needs[r]) and not needs[r].deletes for r in g.ranks)]
        self.listed = {r for g in self.listing for r in g.ranks}
        # Such a relay that is all of its hosts' first streams (no links, mode fixes or
        # files of their own; the same directories) carries their directories too: the
        # relay's receiver alone then writes into them, and gives them their modes last.
        self.whole = [g for g in self.listing if self.relay_is_all(g)]
        self.dirs_relayed = {r for g in self.whole for r in g.ranks}
        # A host of such a relay, but its head (the head's stream comes through OpenSSH's
        # C crypto, not the session's channel), gets nothing of its own: its session,
        # still open from the plan, becomes its relay node instead of taking an empty
        # stream beside a node started for it (one helper start and one channel less).
        self.in_node = {r for g in self.whole for r in g.ranks[1:] if r in sessions}
        # The streams each host gets in the first pass: its own (unless its session is a
        # relay node) and one per relay it is in. The last to end whole unmarks its tree.
        self.parts = {r: (r not in self.in_node) + sum(r in g.ranks for g in self.relays)
                      for r in needs}
        # What the progress shows a host of a relay: its head, what was sent to it; any
        # other, what its node says it has written. Taken back if the relay fails there
        # (all it carried is sent again directly): a host cut off shows what it holds.
        self.relay_shown: Dict[Tuple[int, int], List[int]] = {}
        self.outcomes: Dict[int, List[dict]] = {rank: [] for rank in needs}
        self.errors: Dict[int, MultihostError] = {}
        self.lock = threading.Lock()
        self.in_flight: List[object] = []
        self.cancelled = threading.Event()

    def relay_is_all(self, group: RelayGroup) -> bool:
        dirs = self.needs[group.ranks[0]].dirs
        return all(not self.direct_part(r) and not self.needs[r].meta and self.needs[r].dirs == dirs
                   and sum(r in g.ranks for g in self.relays) == 1 for r in group.ranks)

    def run(self) -> Tuple[Dict[int, HostSync], Dict[int, Dict[str, list]]]:
        started = time.monotonic()
        workers = max(1, min(self.cluster.workers, len(self.needs) + len(self.relays)))
        pool = ThreadPoolExecutor(max_workers=workers)
        try:
            self.first_pass(pool)
            retry = self.second_pass(pool)
        except BaseException:
            # Ctrl-C (or a bug): end every stream now, so the workers return at once; the
            # hosts drop the file they were writing (each file is old or new, never half).
            self.cancel()
            raise
        finally:
            pool.shutdown(wait=True)
        return self.results(retry, time.monotonic() - started), self.keys()

    def first_pass(self, pool: ThreadPoolExecutor) -> None:
        """Each host's direct stream (without what a relay brings) and every relay."""
        jobs = [pool.submit(self.guarded, rank, self.direct_stream, rank, self.direct_part(rank),
                            True)
                for rank in self.needs if rank not in self.in_node]
        jobs += [pool.submit(self.guarded, group.ranks[0], self.relay_stream, group)
                 for group in self.relays]
        for job in jobs:
            job.result()

    def direct_part(self, rank: int) -> List[Entry]:
        return [e for e in self.needs[rank].send if (rank, e.path) not in self.relayed]

    def second_pass(self, pool: ThreadPoolExecutor) -> Dict[int, List[Entry]]:
        """What a relay did not deliver goes directly; returns what was sent again."""
        retry = undelivered(self.outcomes, self.errors)
        for rank in retry:
            for node in self.outcomes[rank]:
                if node.get("relayed") and node.get("error"):
                    files, count = self.relay_shown.get((id(node["group"]), rank), (0, 0))
                    self.board.add([rank], files=-files, count=-count)
        jobs = [pool.submit(self.guarded, rank, self.direct_stream, rank, entries, False)
                for rank, entries in retry.items()]
        for job in jobs:
            job.result()
        return retry

    def guarded(self, rank: int, task: Callable[..., None], *args) -> None:
        if self.cancelled.is_set():
            return
        try:
            task(*args)
        except MultihostError as err:
            with self.lock:
                self.errors.setdefault(rank, err)

    def register(self, process) -> None:
        with self.lock:
            self.in_flight.append(process)
        if self.cancelled.is_set():  # started just as everything was being stopped
            stop_process(process)

    def cancel(self) -> None:
        self.cancelled.set()
        for session in self.sessions.values():
            session.abort()
        with self.lock:
            for process in self.in_flight:
                stop_process(process)

    def direct_stream(self, rank: int, entries: Sequence[Entry], first: bool) -> None:
        host_needs = self.needs[rank]
        # A later stream repeats what a relay carried: that relay may not have got there.
        if first:
            tracked = changes_owned(host_needs) and rank not in self.listed
            dirs = rank not in self.dirs_relayed
        else:
            tracked, dirs = rank in self.listed, rank in self.dirs_relayed
        part = [1, self.parts[rank]] if first else [2, 1]
        fill = direct_fill(host_needs, self.manifest.root, entries,
                           lambda n: self.board.add([rank], count=n),
                           lambda: self.board.add([rank], files=1), first, tracked, dirs, part)
        if first and rank in self.sessions:  # into the session that made the plan
            nodes = self.sessions[rank].send(fill)
        else:
            request = {"root": host_needs.root, "rank": rank, "keys": True}
            if rank in self.claims:
                request["claim"] = self.claims[rank]
            nodes = stream_to(self.cluster.transport(self.hosts[rank]), request, fill,
                              register=self.register)
        with self.lock:
            self.outcomes[rank].append(nodes.get(str(rank), {}))

    def relay_stream(self, group: RelayGroup) -> None:
        head = self.hosts[group.ranks[0]]
        nodes = self.relay_nodes(group, head)
        if nodes is None:
            return  # stopped
        with self.lock:
            for rank in group.ranks:
                node = nodes.get(str(rank)) or {"error": "no answer from the relay"}
                node = dict(node, relayed=True, group=group, head=rank == group.ranks[0])
                self.outcomes[rank].append(node)

    def relay_nodes(self, group: RelayGroup, head) -> Optional[dict]:
        """The relay's answer for each of its hosts (sync/relay.py: a chain whose nodes
        are all started at once); None when the delivery was stopped."""
        hosts = [self.hosts[r] for r in group.ranks]
        transports = [self.cluster.transport(h) for h in hosts]
        hops = [hop_spec(h, t, self.needs[h.rank].root, op="sync.join")
                for h, t in zip(hosts, transports)]
        chain = Chain(transports, [h.label for h in hosts], group.ranks, hops,
                      {r: self.needs[r].root for r in group.ranks}, self.register,
                      sessions={i: self.sessions[r] for i, r in enumerate(group.ranks)
                                if r in self.in_node},
                      claims={r: dict(self.claims[r], part=[1, self.parts[r]])
                              for r in group.ranks if r in self.claims},
                      on_progress=functools.partial(self.relay_progress, group))
        nodes = chain.run(functools.partial(self.head_stream, group, head, transports[0]))
        return None if self.cancelled.is_set() else nodes

    def head_stream(self, group: RelayGroup, head, transport, request: dict) -> dict:
        """The stream to the head: through OpenSSH's C crypto when it can (bulk.py),
        else paramiko."""
        fill = functools.partial(self.write_group, group)
        argv = openssh_argv(transport, self.cluster.options.config_file)
        if argv is not None:
            try:
                return stream_openssh(transport, argv, request, fill, register=self.register)
            except ConnectError:
                pass  # `ssh` would not: paramiko will
        if self.cancelled.is_set():
            return head_failure(group.ranks, head.label, "stopped")
        try:
            return stream_to(transport, request, fill, register=self.register)
        except MultihostError as err:
            return head_failure(group.ranks, head.label, err.cause)

    def relay_progress(self, group: RelayGroup, rank: int, files: int, count: int) -> None:
        """A node of ``group`` has written ``files`` and ``count`` bytes of it."""
        with self.lock:
            shown = self.relay_shown.setdefault((id(group), rank), [0, 0])
            more = (files - shown[0], count - shown[1])
            shown[0], shown[1] = files, count
        self.board.add([rank], files=more[0], count=more[1])

    def head_sent(self, group: RelayGroup, files: int = 0, count: int = 0) -> None:
        head = group.ranks[0]
        with self.lock:
            shown = self.relay_shown.setdefault((id(group), head), [0, 0])
            shown[0] += files
            shown[1] += count
        self.board.add([head], files=files, count=count)

    def write_group(self, group: RelayGroup, writer: Writer) -> None:
        if group in self.listing:
            writer.record({"t": "begin"})
            writer.tracked(self.needs[group.ranks[0]].tracked)
        if group in self.whole:
            write_dirs(writer, self.needs[group.ranks[0]].dirs)
        write_entries(writer, self.manifest.root, group.entries,
                      lambda n: self.head_sent(group, count=n),
                      lambda: self.head_sent(group, files=1))

    def results(self, retry: Dict[int, List[Entry]], seconds: float) -> Dict[int, HostSync]:
        results = {}
        for rank, host_needs in self.needs.items():
            self.board.add([rank], force=True)
            results[rank] = merge_result(self.labels[rank], host_needs, self.outcomes[rank],
                                         self.errors.get(rank), retry.get(rank, ()), seconds)
        return results

    def keys(self) -> Dict[int, Dict[str, list]]:
        keys: Dict[int, Dict[str, list]] = {}
        for rank in self.needs:
            merged: Dict[str, list] = {}
            for node in self.outcomes[rank]:
                merged.update(node.get("keys") or {})
            keys[rank] = merged
        return keys


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


