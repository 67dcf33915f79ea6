"""The controller's side of the ``logs.tail`` wire format (the codec is
remote/logs/frames.py, shared with the host), read as untrusted input: a frame that is not
exactly what the protocol defines ends the host's stream with one line naming the host,
before anything is written.

Also the line joiner that turns a file's bytes into whole lines in bounded memory: a
rank printing a ``\\r`` progress bar for hours never sends a newline, and must not make
the controller hold the whole "line".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..errors import BadReply
from ..remote.logs import frames as log_frames
from ..untrusted import CUT_MARK, MAX_LINE, clean_text, is_log_name



@dataclass(frozen=True)
class Frame:
    kind: str                       # "D" data, "S" state, "H" heartbeat, "E" end
    name: str = ""                  # D: a log name the protocol defines
    offset: int = 0
    data: bytes = b""
    record: Any = None              # S and E: the decoded JSON


def read_frame(stream, host: str) -> Optional[Frame]:
    """The next frame (read by the one codec, remote/logs/frames.py), or None at the end of
    the stream; BadReply naming the host for anything malformed or a name the protocol
    does not define."""
    try:
        frame = log_frames.read_frame(stream, is_log_name)
    except log_frames.BadFrame as err:
        raise _bad(host, str(err)) from None
    if frame is None:
        return None
    if frame.kind == log_frames.DATA:
        return Frame("D", name=frame.name, offset=frame.offset, data=frame.data)
    if frame.kind in (log_frames.STATE, log_frames.END):
        return Frame(frame.kind, record=log_frames.state_of(frame))
    return Frame(frame.kind)


def _bad(host: str, what: str) -> BadReply:
    return BadReply(f"its log stream sent {clean_text(what, 300)}; its logs are no longer "
                    f"followed", host=host,
                    fix="check the multihost helper on that host (it may be altered); "
                        "lines mirrored so far are kept")


class LineJoiner:
    """Whole lines out of one file's bytes, holding at most about MAX_LINE bytes of a line
    that has not ended: a ``\\r`` progress bar keeps only its latest state, and a line
    longer than that keeps its start (it is shown cut; the mirror has it whole)."""

    def __init__(self, limit: int = MAX_LINE):
        self.limit = limit
        self.pending = b""
        self.shown = b""     # the progress state last given out (progress_update)

    def feed(self, data: bytes) -> bytes:
        """The whole lines that ``data`` completes (with their newlines), maybe none."""
        end = data.rfind(b"\n") + 1
        if not end:
            self._hold(data)
            return b""
        first = data.find(b"\n") + 1
        done = self._bounded(self.pending + data[:first]) + data[first:end]
        self.pending = b""
        self._hold(data[end:])
        return done

    def progress_update(self) -> bytes:
        """The latest state of a line being rewritten with ``\\r`` (a progress bar), when
        it changed since the last call; b"" otherwise. Reads back from the end, so it
        costs the latest state, not the held line."""
        pending = self.pending
        end = len(pending)
        while end > 0:
            start = pending.rfind(b"\r", 0, end)
            if start < 0:
                return b""  # an unfinished line, no bar: it waits for its end
            state = pending[start + 1:end]
            if state.strip():
                if state == self.shown:
                    return b""
                self.shown = state
                return state
            end = start
        return b""

    def flush(self) -> bytes:
        """The last line without its newline (a finished rank's), and forget it."""
        rest, self.pending = self.pending, b""
        return rest

    def _hold(self, data: bytes) -> None:
        if data:
            self.pending = self._bounded(self.pending + data)

    def _bounded(self, line: bytes) -> bytes:
        if len(line) <= self.limit:
            return line
        state = line.rstrip(b"\r\n").rfind(b"\r")  # the latest state of a progress bar
        if state > 0:
            line = line[state:]
        if len(line) > self.limit:  # cut where the view cuts, and say so
            ending = b"\n" if line.endswith(b"\n") else b""
            line = line[:self.limit] + (CUT_MARK % self.limit).encode() + ending
        return line
