"""How sync and data checks look: a rich progress bar per host on a terminal, plain
lines otherwise, and the same summary lines in both.

The text of every summary is made by pure functions (``sync_lines``, ``data_lines``,
``data_sync_lines``) so tests compare strings; ``SyncView`` is the listener that the
engine (``sync/``, ``data/``) calls from its threads.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Dict, List, Optional

from .terminal import wants_plain

if TYPE_CHECKING:  # the data side is imported only when data is checked
    from ..data import DataReport, DataSyncReport
    from ..events import SyncProgress
    from ..sync.model import HostSync, SyncReport

PLAIN_EVERY = 2.0   # seconds between progress lines per host when not on a terminal


def human_bytes(count: float) -> str:
    """The sync's own way of writing sizes, from its module when first needed: the view
    is made before a sync starts its hosts' checks, which wait for no more imports."""
    from ..sync.manifest import human_bytes as written

    return written(count)


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _listed(prefix: str, names, count: int) -> List[str]:
    """The names shown, one a line, then how many more there are."""
    more = [f"{prefix} ... and {count - len(names)} more"] if count > len(names) else []
    return [f"{prefix} {name}" for name in names] + more


def host_line(result: HostSync, dry_run: bool = False) -> str:
    if not result.ok:
        return f"{result.host}: FAILED: {result.error}" + (f" (fix: {result.fix})" if result.fix else "")
    added, changed, removed = result.counts
    if dry_run:
        if not (added or changed or removed or result.meta):
            return f"{result.host}: up to date"
        parts = [f"would add {added}, change {changed}, delete {removed}"]
        if result.meta:
            parts.append(f"fix the mode or time of {result.meta}")
        return f"{result.host}: " + "; ".join(parts) + f" ({human_bytes(result.bytes)} to send)"
    if not (result.files or result.deleted or result.meta):
        note = f" ({result.notes[0]})" if result.notes else ""
        return f"{result.host}: up to date{note}"
    text = f"{result.host}: {_count(result.files, 'file')} ({human_bytes(result.bytes)}) written"
    if result.deleted:
        text += f", {result.deleted} deleted"
    if result.meta:
        text += f", {result.meta} re-stamped"
    if result.relayed_bytes:
        text += f"; {human_bytes(result.relayed_bytes)} came host to host"
    return text


def sync_lines(report: SyncReport) -> List[str]:
    """The summary of a sync (or of a dry run: what would change, path by path)."""
    revision = ""
    if report.commit:
        revision = f" at git {report.commit[:12]}" + (" (dirty: uncommitted changes travel too)"
                                                       if report.dirty else "")
    lines = [f"code {report.code_dir}: {_count(report.files, 'file')}, "
             f"{human_bytes(report.bytes)}{revision}"]
    for result in report.hosts:
        lines.append(host_line(result, report.dry_run))
        if report.dry_run and result.ok:
            for mark, names, count in (("+", result.added, result.counts[0]),
                                       ("~", result.changed, result.counts[1]),
                                       ("-", result.removed, result.counts[2])):
                lines += _listed(f"    {mark}", names, count)
        for note in result.notes:
            if result.files or result.deleted or result.meta:
                lines.append(f"    note: {note}")
        for path in result.kept:
            lines.append(f"    kept {path}/: it holds files multihost did not put there")
    lines += [f"{len(s.hosts)} hosts share {s.root}: written once by {s.writer}, checked from "
              f"{', '.join(s.checkers) or 'none'}" for s in report.shared]
    lines += [f"warning: {w}" for w in report.warnings]
    done = [h for h in report.hosts if h.ok]
    if report.dry_run:
        lines.append(f"dry run: nothing was changed ({report.seconds:.1f}s)")
    else:
        sent = sum(h.bytes for h in done)
        line = (f"{len(done)} of {len(report.hosts)} hosts identical to {report.code_dir} "
                f"({human_bytes(sent)} written in {report.seconds:.1f}s)")
        if not report.ok:
            line += f"; FAILED: {', '.join(h.host for h in report.failed)}"
        lines.append(line)
    return lines


def data_lines(report: DataReport) -> List[str]:
    from ..data import describe

    lines = []
    for index, path in enumerate(report.paths):
        states = [h.states[index] for h in report.hosts if h.states]
        bad = [h for h in report.hosts if h.error is None and h.diffs and not h.diffs[index].empty]
        if not bad and all(h.error is None for h in report.hosts):
            size = states[0] if states else None
            what = f"{_count(size.files, 'file')}, {human_bytes(size.bytes)}" if size else ""
            lines.append(f"data {path}: identical on {_count(len(report.hosts), 'host')} ({what})")
            continue
        reference = next((h.diffs[index].reference for h in bad if h.diffs[index].reference), "")
        if bad and len(bad) == len(report.hosts) and all(h.diffs[index].absent for h in bad):
            lines.append(f"data {path}: exists on none of the {len(bad)} hosts")
            continue
        if bad:
            lines.append(f"data {path}: differs on {len(bad)} of {len(report.hosts)} hosts "
                         f"(compared with {reference or 'the first host'})")
        for host in bad:
            diff = host.diffs[index]
            lines.append(f"  {host.host}: {describe(diff)}")
            for word, names, count in (("missing", diff.missing, diff.counts[0]),
                                       ("extra", diff.extra, diff.counts[1]),
                                       ("differing", diff.differing, diff.counts[2])):
                lines += _listed(f"      {word:<9}", names, count)
        if path in report.odd_first:
            lines.append("  note: the first host is the odd one out: the others agree with "
                         "each other; --sync-data will refuse to copy from it")
    for host in report.hosts:
        if host.error:
            lines.append(f"  {host.host}: FAILED: {host.error}" + (f" (fix: {host.fix})" if host.fix else ""))
    return lines


def data_sync_lines(report: DataSyncReport) -> List[str]:
    lines = []
    for host in report.hosts:
        if not host.ok:
            lines.append(f"{host.host}: data copy FAILED: {host.error}" +
                         (f" (fix: {host.fix})" if host.fix else ""))
            continue
        text = f"{host.host}: {_count(host.files, 'file')} ({human_bytes(host.bytes)}) copied host to host"
        if host.moved_aside:
            text += f"; {host.moved_aside} replaced or extra moved to {', '.join(host.trash)}"
        lines.append(text)
    return lines


class SyncView:
    """Listener for the sync and data engines; then ``show_*`` prints the summaries."""

    def __init__(self, out: Optional[IO[str]] = None, plain: Optional[bool] = None):
        self.out = out or sys.stdout
        self.plain = wants_plain(self.out) if plain is None else plain
        self._lock = threading.Lock()
        # A sync of hosts that may share a workdir goes in parts (sync/shared.py), each
        # scanning the same code: it is said once.
        self._scanned = False
        self._last: Dict[str, float] = {}
        self._progress = None
        self._tasks: Dict[str, int] = {}

    # -- events, from the engine's threads ----------------------------------------------
    def __call__(self, event: object) -> None:
        from ..events import SyncHostDone, SyncPlanned, SyncProgress, SyncScanned, SyncWaiting

        with self._lock:
            if isinstance(event, SyncScanned):
                if self._scanned:
                    return
                self._scanned = True
                self._say(f"code: {_count(event.files, 'file')}, {human_bytes(event.bytes)}"
                          + (f" (hashed {human_bytes(event.hashed_bytes)})" if event.hashed_files else ""))
            elif isinstance(event, SyncPlanned):
                needs = event.needs
                if not needs.empty:
                    self._start(event.host, needs.files, needs.bytes)
                    if self.plain:
                        self._say(f"{event.host}: sending {_count(needs.files, 'file')} "
                                  f"({human_bytes(needs.bytes)}), deleting {len(needs.deletes)}")
            elif isinstance(event, SyncProgress):
                self._advance(event)
            elif isinstance(event, SyncHostDone):
                self._finish(event.result.host)
            elif isinstance(event, SyncWaiting):
                self._say(f"{event.host}: {event.text}")
            else:
                self._data_progress(event)

    def _data_progress(self, event: object) -> None:
        from ..events import DataProgress

        if isinstance(event, DataProgress):
            if self.plain:
                if self._due(f"data {event.host}"):
                    self._say(f"{event.host}: hashing {event.path}: "
                              f"{_count(event.files, 'file')}, {human_bytes(event.bytes)}")
            else:
                key = f"hashing {event.host}"
                if key not in self._tasks:
                    self._start(key, 0, 0, total=None)
                self._progress.update(self._tasks[key], completed=event.bytes,
                                      files=f"{event.files} files")

    def _say(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, highlight=False)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def _due(self, key: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(key, 0.0) < PLAIN_EVERY:
            return False
        self._last[key] = now
        return True

    def _start(self, host: str, files: int, size: int, total: object = "size") -> None:
        if self.plain:
            # The first progress line comes after PLAIN_EVERY: a quick sync prints none.
            self._last[host] = time.monotonic()
            return
        if self._progress is None:
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                       TransferSpeedColumn)

            self._progress = Progress(
                TextColumn("{task.description:<16}"), BarColumn(),
                TextColumn("{task.fields[files]:>13}"), DownloadColumn(), TransferSpeedColumn(),
                console=Console(file=self.out), transient=True)
            self._progress.start()
        self._tasks[host] = self._progress.add_task(
            host, total=max(size, 1) if total == "size" else total, files=f"0/{files} files")

    def _advance(self, event: SyncProgress) -> None:
        if self.plain:
            if self._due(event.host):
                self._say(f"{event.host}: {event.files_done}/{event.files_total} files, "
                          f"{human_bytes(event.bytes_done)}/{human_bytes(event.bytes_total)}")
            return
        if event.host not in self._tasks:  # a copy with no plan first (--sync-data)
            self._start(event.host, event.files_total, event.bytes_total)
        task = self._tasks.get(event.host)
        if task is not None and self._progress is not None:
            self._progress.update(task, completed=event.bytes_done,
                                  files=f"{event.files_done}/{event.files_total} files")

    def _finish(self, host: str) -> None:
        task = self._tasks.pop(host, None)
        if task is not None and self._progress is not None:
            self._progress.update(task, completed=self._progress.tasks[task].total)
        if not self._tasks:
            self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    # -- summaries -------------------------------------------------------------------------
    def _print(self, lines: List[str]) -> None:
        self.close()
        with self._lock:
            self.out.write("".join(line + "\n" for line in lines))
            self.out.flush()

    def show_sync(self, report: SyncReport) -> None:
        self._print(sync_lines(report))

    def show_data(self, report: DataReport) -> None:
        self._print(data_lines(report))

    def show_data_sync(self, report: DataSyncReport) -> None:
        self._print(data_sync_lines(report))
