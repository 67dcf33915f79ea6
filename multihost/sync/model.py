"""What a sync computes, as small frozen records: each host's needs (from its plan),
each host's result, the report, and the events the views listen to. Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..errors import MultihostError, SyncError, and_more
from ..remote.sync.fs import DIR, FILE
from .manifest import Entry, Manifest

SHOWN = 5  # paths named per host in a report; the rest are counted


@dataclass(frozen=True)
class HostNeeds:
    """What one host lacks, from its plan reply: computed once, rendered anywhere."""

    rank: int
    root: str                          # the workdir, resolved on the host
    send: Tuple[Entry, ...]            # files and links whose content must travel
    relayable: Tuple[Entry, ...]       # of those: files that may come by relay
    dirs: Tuple[Entry, ...]            # directories to create or fix
    meta: Tuple[Entry, ...]            # files with the right content, another mode/mtime
    deletes: Tuple[str, ...]           # removed here and put there by a sync; deepest first
    added: Tuple[str, ...]
    changed: Tuple[str, ...]
    tracked: Tuple[str, ...]           # what the host will know as ours afterwards
    errors: Tuple[Tuple[str, str], ...] = ()

    @property
    def files(self) -> int:
        return len(self.send)

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.send if e.kind == FILE)

    @property
    def empty(self) -> bool:
        return not (self.send or self.dirs or self.meta or self.deletes)


@dataclass(frozen=True)
class HostSync:
    host: str
    rank: int
    root: str = ""
    files: int = 0                     # files and links written
    bytes: int = 0
    relayed_bytes: int = 0             # of which arrived host to host
    deleted: int = 0
    meta: int = 0
    added: Tuple[str, ...] = ()        # the first few, for dry runs and reports
    changed: Tuple[str, ...] = ()
    removed: Tuple[str, ...] = ()
    counts: Tuple[int, int, int] = (0, 0, 0)   # added, changed, removed
    kept: Tuple[str, ...] = ()         # directories not removed: they hold other files
    notes: Tuple[str, ...] = ()        # e.g. a relay that fell back to direct
    error: Optional[str] = None
    fix: Optional[str] = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class SharedWorkdir:
    """A workdir that several hosts of a sync see as one directory (sync/shared.py):
    written once, by ``writer``, and checked from ``checkers`` (one host, unless that
    check failed); the other hosts are counted as verified by that check."""

    root: str
    hosts: Tuple[str, ...]
    writer: str
    checkers: Tuple[str, ...]


@dataclass(frozen=True)
class SyncReport:
    code_dir: str
    files: int
    bytes: int
    hosts: Tuple[HostSync, ...]
    commit: Optional[str] = None
    dirty: bool = False
    dry_run: bool = False
    verify: bool = False
    warnings: Tuple[str, ...] = ()
    seconds: float = 0.0
    shared: Tuple[SharedWorkdir, ...] = ()

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    @property
    def failed(self) -> Tuple[HostSync, ...]:
        return tuple(h for h in self.hosts if not h.ok)


def _tracked_name(entry: Entry) -> str:
    return entry.path + "/" if entry.kind == DIR else entry.path


def needs_from_plan(manifest: Manifest, rank: int, plan: dict) -> HostNeeds:
    """Turn a host's sync_plan reply into what it needs. Deletions: paths a sync put on
    the host that are gone here and not ignored now (ignored files are left alone)."""
    entries = manifest.entries
    added = [entries[i] for i in plan.get("add", [])]
    changed = [entries[i] for i in plan.get("change", [])]
    retyped = [entries[i] for i in plan.get("retype", [])]
    meta = [entries[i] for i in plan.get("meta", [])]
    wanted = {_tracked_name(e) for e in entries}
    deletes = []
    for name in plan.get("gone", []):
        if name in wanted:
            continue
        path, is_dir = name.rstrip("/"), name.endswith("/")
        if path and not manifest.rules.ignored(path, is_dir):
            deletes.append(path)
    deletes.sort(key=lambda p: (-p.count("/"), p))
    content = [e for e in added + changed + retyped if e.kind != DIR]
    content.sort(key=lambda e: e.path)
    return HostNeeds(
        rank=rank, root=plan.get("root", ""),
        send=tuple(content),
        relayable=tuple(e for e in added + changed if e.kind == FILE),
        dirs=tuple(sorted((e for e in added + changed + retyped + meta if e.kind == DIR),
                          key=lambda e: e.path)),
        meta=tuple(e for e in meta if e.kind != DIR),
        deletes=tuple(deletes),
        added=tuple(e.path for e in added if e.kind != DIR),
        changed=tuple(e.path for e in changed + retyped if e.kind != DIR),
        tracked=tuple(sorted(wanted)),
        errors=tuple((str(p), str(t)) for p, t in plan.get("errors", [])))


def failed_result(label: str, rank: int, error: MultihostError, root: str = "") -> HostSync:
    return HostSync(label, rank, root, error=error.cause, fix=error.fix)


def listing(needs: HostNeeds) -> dict:
    return dict(added=needs.added[:SHOWN], changed=needs.changed[:SHOWN],
                removed=needs.deletes[:SHOWN],
                counts=(len(needs.added), len(needs.changed), len(needs.deletes)))


def dry_result(label: str, needs: HostNeeds) -> HostSync:
    return HostSync(label, needs.rank, needs.root, files=needs.files, bytes=needs.bytes,
                    meta=len(needs.meta), **listing(needs))


def merge_result(label: str, needs: HostNeeds, nodes: List[dict], error: Optional[MultihostError],
                 resent: Sequence[Entry], seconds: float) -> HostSync:
    """One host's result from the replies of every stream it got (its own, relays, and
    the resend of what a relay did not deliver)."""
    files = size = relayed = deleted = meta = 0
    kept: List[str] = []
    notes: List[str] = []
    problems: List[Tuple[str, str]] = list(needs.errors)
    resent_paths = {e.path for e in resent}
    for node in nodes:
        if node.get("relayed") and node.get("error"):
            notes.append(f"{node['error'].rstrip('.')}; sent from the controller instead "
                         "(hosts that can ssh each other get heavy files host to host)")
            continue
        if node.get("waited"):
            notes.append(waited_note(node["waited"]))
        files += node.get("files", 0) + node.get("links", 0)
        size += node.get("bytes", 0)
        if node.get("relayed") and not node.get("head"):  # the head had it from us
            relayed += node.get("bytes", 0)
        deleted += node.get("deleted", 0)
        meta += node.get("meta", 0)
        kept += node.get("kept", [])
        for path, text in node.get("errors", []):
            if not (node.get("relayed") and path in resent_paths):
                problems.append((path, text))
    if error is None and problems:
        path, text = problems[0]
        more = and_more([p for p, _ in problems[1:]])
        cause, fix = f"{path}: {text}{more}", "fix the cause on the host, then sync again"
    elif error is not None:
        cause, fix = error.cause, error.fix
    else:
        cause = fix = None
    return HostSync(label, needs.rank, needs.root, files, size, relayed, deleted, meta,
                    kept=tuple(kept), notes=tuple(notes), error=cause, fix=fix, seconds=seconds,
                    **listing(needs))


def waited_note(waited) -> str:
    """A host's helper waited for another writer of its workdir (remote/sync/lock.py)."""
    seconds, holder = waited
    return f"waited {float(seconds):.0f} s for {holder}"


def sync_error(report: SyncReport) -> SyncError:
    failed = report.failed
    if len(failed) == 1:
        only = failed[0]
        err = SyncError(f"sync failed: {only.error}", host=only.host, fix=only.fix)
    else:
        causes = "; ".join(f"{h.host}: {h.error}" for h in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        err = SyncError(f"sync failed on {len(failed)} of {len(report.hosts)} hosts: {causes}{more}",
                        fix=failed[0].fix)
    err.report = report  # type: ignore[attr-defined]
    return err
