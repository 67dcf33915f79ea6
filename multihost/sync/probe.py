"""A host checked while the controller hashes, and a small change sent to it in the same
command: one `ssh` client per host for a sync that finds little to do.

A sync that finds nothing (or one edit) to do is mostly waiting: for the controller's
manifest, then for each host's `stat`. So the host's side starts first: the probe is
started as the sync starts (sync_quick's ``probe_script``), is handed the recorded names
at once, and checks the host against its record while the controller is still hashing.
Once the manifest is built, the controller sends it the rest: nothing (the host was only
to be checked) or the writes of a small change with their contents. rsync with a
ControlMaster pays one `ssh` client per host; so does this.

The probe's reply is believed only as far as it goes: no CHECKED line (or no reply in
time) means the host may be anything, and it is compared by content.
"""
from __future__ import annotations

import threading
from typing import List, Optional, Tuple

from ..transport.base import BrokenStream
from .fastpath import names_digest, record_names
from .quick import (CHECKED, NAMES_KEPT, HostMoved, probe_reply, probe_script, probe_writes,
                    restated)


class Probe:
    """One host's probe command: the recorded names go to it at once (a thread of its
    own, so a host that stops reading holds up nothing), its output is read to the end
    by another, and ``finish`` waits for that at most its timeout, then kills it."""

    def __init__(self, process, names: bytes, digest: str = "", holds: bool = False):
        self.process = process
        self._names = b"" if holds else names   # a host that holds them is sent none
        self._digest = digest
        # Once the host said it is as recorded: the hash of the names it holds ("" if
        # none), for its record (sync_pipeline), so that its next check is sent none.
        self.held = digest if holds else ""
        self._rest = b""
        self._go = threading.Event()
        self._out: List[bytes] = []
        self._writer = _background(self._write)
        self._reader = _background(lambda: self._out.append(process.stdout.read()))

    @classmethod
    def start(cls, transport, record: dict) -> Optional["Probe"]:
        """Started at once; None when the record has no hash of the host's `stat` answer
        to check against (the caller checks by parsing it), or the command cannot start."""
        if not record.get("stat") or not record["names"]:
            return None
        names = names_digest(record)
        held = record.get("held") == names  # its last check kept them: none are sent
        try:
            process = transport.start(probe_script(record["root"], len(record["names"]),
                                                   record["stat"], keep="answer" not in record,
                                                   names=names, held=held))
        except Exception:  # any trouble here only means: check the other way
            return None
        return cls(process, record["names"], names, held)

    def _write(self) -> None:
        stdin = self.process.stdin
        try:
            stdin.write(self._names)
            stdin.flush()
            self._go.wait()
            if self._rest:
                stdin.write(self._rest)
            stdin.close()
        except BrokenStream:  # the host stopped reading: what it printed says why
            pass

    def finish(self, rest: bytes = b"", timeout: float = 60) -> Tuple[bool, Optional[bytes]]:
        """Send ``rest`` (sync_quick's ``probe_writes`` and the files) or nothing, end
        the input, and read the reply: (whether the host found itself as recorded, what
        it printed after that if it then succeeded, else None)."""
        self._rest = rest
        self._go.set()
        self._reader.join(timeout)
        if self._reader.is_alive():  # a host that does not answer in time: unknown
            self.abort()
            return False, None
        try:
            code = self.process.wait(timeout)
        except Exception:
            code = None
        _close(self.process)
        out = self._out[0] if self._out else b""
        if out.startswith(NAMES_KEPT):
            self.held, out = self._digest, CHECKED + out[len(NAMES_KEPT):]
        if not out.startswith(CHECKED):
            self.held = ""
            return False, None
        return True, out[len(CHECKED):] if code == 0 else None

    def write(self, label: str, needs, record: dict, files, data: bytes, timeout: float) -> dict:
        """Write ``files`` (``data``: their contents) on a host found as recorded; the
        reply a helper stream would give (sync_quick's ``written_reply``). HostMoved:
        the host did not say it is as recorded, nothing was written; SyncError: it was,
        and the writes did not all complete (each file is old or new)."""
        names = record_names(record)
        again = restated(names, files)
        writes = probe_writes(files, [names[i] for i in again], keep="answer" not in record)
        checked, out = self.finish(writes + data, timeout)
        if not checked:
            raise HostMoved("the host is not as the last sync left it, or did not say so",
                            host=label, fix="none needed: the sync compares by content")
        return probe_reply(label, needs, record, files, out, again)

    def abort(self) -> None:
        """Stop the command (nothing more is sent: whatever it was doing, the host stays
        as recorded or gets none of the writes, each file old or new)."""
        self._go.set()
        try:
            self.process.kill()
            self.process.wait(5)
        except Exception:  # gone already, or a channel that only closes
            pass
        _close(self.process)


def _close(process) -> None:
    from .transfer import close_process  # here: the probe starts before transfer is loaded

    close_process(process)


def _background(work) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread
