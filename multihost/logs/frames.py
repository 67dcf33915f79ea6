"""The controller's side of the ``logs.tail`` wire format (see remote/ops_logs.py), read as
untrusted input: a frame that is not exactly what the protocol defines ends the host's
stream with one line naming the host, before anything is written.

Also the line joiner that turns a file's bytes into whole lines in bounded memory: a
rank printing a ``\\r`` progress bar for hours never sends a newline, and must not make
the controller hold the whole "line".
"""
from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import BadReply
from ..untrusted import CUT_MARK, MAX_LINE, clean_text, is_log_name

MAX_HEADER = 4096           # bytes of a header line; a real one is under 100
MAX_FRAME = 16 << 20        # bytes of one frame's data; the helper sends at most 1 MiB
_NUMBER = re.compile(r"\d{1,15}")


@dataclass(frozen=True)
class Frame:
    kind: str                       # "D" data, "S" state, "H" heartbeat, "E" end
    name: str = ""                  # D: a log name the protocol defines
    offset: int = 0
    data: bytes = b""
    record: Any = None              # S and E: the decoded JSON


def read_frame(stream, host: str) -> Optional[Frame]:
    """The next frame, or None at the end of the stream; BadReply for anything malformed."""
    header = stream.readline(MAX_HEADER)
    if not header:
        return None
    if not header.endswith(b"\n"):
        if len(header) >= MAX_HEADER:
            raise _bad(host, "a frame header longer than %d bytes" % MAX_HEADER)
        raise EOFError("log stream ended inside a frame header")
    try:
        text = header[:-1].decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(host, "a frame header that is not UTF-8 text") from None
    kind, _, rest = text.partition(" ")
    if kind in ("D", "Z"):
        return _data(stream, host, kind, rest)
    if kind in ("S", "E"):
        try:
            return Frame(kind, record=json.loads(rest))
        except ValueError:
            raise _bad(host, f"a {kind} frame whose record is not JSON: {rest!r}") from None
    if kind == "H":
        return Frame("H")
    raise _bad(host, f"an unknown frame {text!r}")


def _data(stream, host: str, kind: str, rest: str) -> Frame:
    fields = rest.split(" ")
    want = 3 if kind == "D" else 4
    if len(fields) != want or not all(_NUMBER.fullmatch(f) for f in fields[1:]):
        raise _bad(host, f"a malformed frame header {kind} {rest!r}")
    name, numbers = fields[0], [int(f) for f in fields[1:]]
    if not is_log_name(name):
        raise _bad(host, f"a log frame for {name!r}, which is not a log file of a run "
                         f"(only launcher.log and log/workerlog.N are)")
    offset, length = numbers[0], numbers[1]
    packed = numbers[2] if kind == "Z" else length
    if length > MAX_FRAME or packed > MAX_FRAME:
        raise _bad(host, f"a log frame of {max(length, packed)} bytes (at most {MAX_FRAME})")
    data = read_exact(stream, packed)
    if kind == "Z":
        inflater = zlib.decompressobj()
        try:
            data = inflater.decompress(data, length + 1)  # bounded: no zip bomb
        except zlib.error:
            data = b""
        if len(data) != length or not inflater.eof:
            raise _bad(host, "a log frame that arrived damaged (it does not unpack to "
                             "its stated size)")
    return Frame("D", name=name, offset=offset, data=data)


def read_exact(stream, length: int) -> bytes:
    chunks, left = [], length
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("log stream ended inside a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


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
