"""The trust boundary: everything a host sends is untrusted input.

A host (or anything that took it over) can answer a helper call, a log frame or a status
record with anything at all. What it sends enters the controller's model only through
the functions here, so every view, record and error built from it is safe:

- text is cleaned once, where it enters: valid UTF-8, the latest state of a ``\\r``
  progress bar, no terminal escape (CSI colours, OSC 0 window titles, OSC 52 clipboard
  writes ...) and no control character, and cut visibly when over long;
- a log file's name is one of the names the protocol defines, never a path of the
  host's choosing;
- a record's numbers are numbers and its words are clean one-line text, whatever the
  JSON held.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Tuple

MAX_LINE = 64 * 1024        # characters of one log line shown; the mirror keeps it whole
MAX_TEXT = 2000             # characters of one word of a record or an error
MAX_TAIL = 200              # lines of a record's tail
CUT_MARK = " [... line cut at %d characters; the log mirror has it whole]"

# ESC then: a CSI sequence (colours, cursor), an OSC or other string sequence (window
# title, clipboard, hyperlinks) up to its terminator, or any other two-character escape.
# The same with the one-character C1 introducers (0x9b CSI, 0x9d OSC ...).
_ESCAPE = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
                     r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                     r"|\x1b[ -/]*[0-~]?")
# C0 controls but tab and newline, DEL, and the C1 controls (a terminal may obey 0x9b as CSI).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f\x80-\x9f]")
_LOG_NAME = re.compile(r"launcher\.log|gpu\.log|log/(worker|server)log\.[0-9]{1,6}")
GPU_LOG = "gpu.log"


def is_log_name(name: str) -> bool:
    """The names a log frame may carry: the launcher's log, one log per local rank, one
    per parameter server of a PS job (paddle's serverlog.N), and the GPU samples.
    Anything else (``../x``, an absolute path, a dot file) would choose where the
    controller writes."""
    return bool(_LOG_NAME.fullmatch(name))


def clean_line(raw: bytes) -> str:
    """One log line safe to show anywhere: valid text, the last state of a ``\\r``
    progress bar, no terminal escapes or control characters, at most MAX_LINE long."""
    text = raw.decode("utf-8", "replace").rstrip("\n")
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    text = _CONTROL.sub("\ufffd", _ESCAPE.sub("", text))
    return _cut(text)


_NEEDS_CLEANING = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")  # \r and ESC are in it
_HARMLESS_BYTES = bytes(b for b in range(256) if b in (9, 10) or 32 <= b != 127)


def clean_block(data: bytes) -> str:
    """``clean_line`` for a block of whole lines, joined by newlines; a clean block (the
    usual case) costs one decode and one scan, at C speed, whatever its number of lines."""
    text = data.decode("utf-8", "replace")
    if text.endswith("\n"):
        text = text[:-1]
    # Deleting every harmless byte leaves nothing: no C0 control; no 0xc2 lead byte: no
    # C1 control. A few ms per MiB, ten times less than a regex search of the text.
    plain = not data.translate(None, _HARMLESS_BYTES) and b"\xc2" not in data
    if plain and not _has_long_line(text):
        return text
    return "\n".join(clean_line(line.encode("utf-8"))
                     if len(line) > MAX_LINE or _NEEDS_CLEANING.search(line) else line
                     for line in text.split("\n"))


def _has_long_line(text: str) -> bool:
    """Whether a line is over MAX_LINE, in jumps of about MAX_LINE (16 finds per MiB)."""
    start = 0
    while start + MAX_LINE < len(text):
        newline = text.rfind("\n", start, start + MAX_LINE + 1)
        if newline < 0:
            return True
        start = newline + 1
    return False


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE else text[:MAX_LINE] + CUT_MARK % MAX_LINE


def clean_text(value: Any, limit: int = MAX_TEXT) -> str:
    """One line of text from a host (an error, a detail, a state): escapes removed,
    newlines and controls made visible, cut at ``limit``. Not a string: its repr."""
    text = value if isinstance(value, str) else "" if value is None else repr(value)
    if "\x1b" in text or _CONTROL_OR_NEWLINE.search(text):
        text = _ESCAPE.sub("", text).replace("\r\n", " ").replace("\n", " ").replace("\t", " ")
        text = _CONTROL_OR_NEWLINE.sub("\ufffd", text)
    return text if len(text) <= limit else text[:limit] + "..."


def clean_lines(value: Any, limit: int = MAX_TAIL) -> Tuple[str, ...]:
    """A list of lines from a record (a rank's last lines): the last ``limit``, each clean."""
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(clean_line(line.encode("utf-8", "replace")) if isinstance(line, str)
                 else clean_text(line) for line in value[-limit:])


def as_int(value: Any) -> Optional[int]:
    """A record's integer (an exit code, a pid), or None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if -(1 << 62) < value < (1 << 62) else None


def as_time(value: Any) -> Optional[float]:
    """A record's epoch time, or None: not a number, not finite, or absurd."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value < 1e11 else None


def as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


def clean_report(value: Any, depth: int = 0) -> Any:
    """Every string of a JSON reply cleaned of escapes and controls but its newlines and
    tabs (a report may carry a tool's raw output, parsed here), keys too: for replies
    that are only read and shown (check facts, process listings, data reports)."""
    if depth > 32:
        return None
    if isinstance(value, str):
        if "\x1b" in value or _CONTROL.search(value):
            value = _CONTROL.sub("\ufffd", _ESCAPE.sub("", value))
        return value
    if isinstance(value, dict):
        return {clean_report(k, depth + 1): clean_report(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_report(v, depth + 1) for v in value]
    return value
