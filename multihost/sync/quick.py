"""A small edit, written by the host's own shell: no Python started there.

The usual loop is: edit a file or two, sync, run. When a host's record (sync_fastpath)
says the change is new content for a few files that are already there as regular files,
the host needs no comparison and no helper: one shell command, one round trip, first
checks that the host is exactly as the record says (the hash of its `stat` answer for
every recorded path, the fast path's own check, done by the host's `sha256sum`), then
writes each file to a temporary name next to it (`dd`, exactly its size), checks the size,
sets mode and mtime, renames it over the old one, and `stat`s every recorded path again
for the next fast path. Starting the Python helper costs a host 30-50 ms of CPU, and a
separate check one more `ssh` client and round trip; this costs a few milliseconds.

A host that is not as recorded writes nothing and says so (no CHECKED line): the caller
then compares by content. After the check, a failure leaves the host as recorded but for
files that are each old or new, which the helper's stream then writes.

Atomic as the helper is: a host sees the old file or the new one. A stream cut short
leaves a short temporary file, which fails the size check and is removed (the shell's
EXIT trap also runs on HUP, INT, TERM and PIPE). Anything else (new files, deletions,
directories, links, a type change, a host without GNU coreutils, any failure) goes the
helper's way, which is always correct: this path only ever saves time.
"""
from __future__ import annotations

import os
import shlex
import stat
from typing import List, Optional, Sequence, Tuple

from ..errors import SyncError
from .fastpath import (FIELDS, STAT_FORMAT, parse_stat_output, record_entries, record_names,
                       verified_digest)
from .manifest import FILE, Entry
from .model import HostNeeds
from ..transport import quote_path

MAX_FILES = 16
MAX_BYTES = 1 << 20
# The line a host prints once it has found its tree exactly as recorded, before writing.
CHECKED = b"checked\n"


class HostMoved(SyncError):
    """The host is not as its record says (or did not say it is): nothing was written."""

# clean DIR: remove what a killed receiver left there (its pid is gone), as the helper does.
# put SIZE MODE MTIME DIR NAME: the temporary file carries this shell's pid, and is
# created exclusively (never through a link).
_FUNCTIONS = r"""t= o=
trap 'rm -f -- "$t" "$o"' EXIT
trap 'exit 1' HUP INT TERM PIPE
clean() {
  for f in "$1"/.mh-tmp.*; do
    p=${f##*/.mh-tmp.}; p=${p%%.*}
    case $p in ''|*[!0-9]*) continue;; esac
    [ -d "/proc/$p" ] || rm -f -- "$f"
  done
}
put() {
  t=$4/.mh-tmp.$$.$5
  if [ "$1" -gt 0 ]; then
    dd of="$t" bs="$1" count=1 iflag=fullblock conv=excl status=none || return 1
  else
    (set -C; : > "$t") || return 1
  fi
  [ "$(stat -c %s -- "$t")" = "$1" ] && chmod "$2" -- "$t" && touch -m -d "@$3" -- "$t" &&
    mv -f -T -- "$t" "$4/$5" && t=
}
"""


def quick_files(needs: HostNeeds, record: dict) -> Optional[Sequence[Entry]]:
    """The files of a change this path can write, or None when the helper must."""
    if needs.deletes or needs.dirs or needs.meta or needs.added or needs.errors:
        return None
    files = needs.send
    if not files or len(files) > MAX_FILES or sum(e.size for e in files) > MAX_BYTES:
        return None
    recorded = {entry[0]: entry[1] for entry in record_entries(record)}
    if len(needs.tracked) != len(recorded):
        return None  # not the same paths (one is ignored now, say)
    if any(e.kind != FILE or recorded.get(e.path) != FILE for e in files):
        return None  # a new path or a type change: the helper handles those
    if any(not _utf8(e.path) for e in files):
        return None  # a name that only the helper's binary stream can carry
    return files


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def script(root: str, files: Sequence[Entry], check: Optional[Tuple[int, str]] = None,
           again: Sequence[str] = ()) -> str:
    """The shell command that writes ``files``: their contents come first on its input,
    then every recorded name, whose `stat` answer it prints at the end.

    ``check``: (length, hash) of the recorded names, which then come first on the input,
    and of the host's `stat` answer for them: nothing is written unless the answer has
    that hash. That answer is then the one printed, followed by the answer for the paths
    ``again`` (the files written and their directories) after the write: every recorded
    path is `stat`ed once, not twice (see ``splice``)."""
    lines = [f"cd -- {quote_path(root)} || exit 1", _FUNCTIONS]
    answer = f"stat --printf {shlex.quote(STAT_FORMAT)} --"
    if check is not None:
        size, digest = check
        lines += ["o=$(mktemp) || exit 1",
                  f'dd bs={size} count=1 iflag=fullblock status=none | xargs -0 -r {answer} '
                  f'> "$o" || exit 1',
                  f'[ "$(sha256sum < "$o")" = {shlex.quote(digest + "  -")} ] || exit 3',
                  f"printf {shlex.quote(CHECKED.decode())}"]
    for directory in sorted({os.path.dirname(e.path) or "." for e in files}):
        lines.append(f"clean {shlex.quote(directory)}")
    for entry in files:
        directory, name = os.path.split(entry.path)
        mtime = f"{entry.mtime_ns // 1_000_000_000}.{entry.mtime_ns % 1_000_000_000:09d}"
        lines.append("put " + " ".join(shlex.quote(word) for word in (
            str(entry.size), f"{entry.mode:o}", mtime, directory or ".", name)) + " || exit 1")
    if check is None:
        # The rest of the input is every recorded name: the answer the next fast path expects.
        lines.append(f"exec xargs -0 -r {answer}")
    else:
        lines.append(f'cat -- "$o" && {answer} ' + " ".join(shlex.quote(n) for n in again))
    return "\n".join(lines)


def restated(names: Sequence[str], files: Sequence[Entry]) -> List[int]:
    """The positions in ``names`` of the paths a write changes: each file, and the
    directory it is renamed into (its mtime moves; the code directory itself is not a
    recorded path)."""
    moved = {e.path for e in files} | {os.path.dirname(e.path) for e in files}
    return [index for index, name in enumerate(names) if name in moved]


def splice(out: bytes, count: int, positions: Sequence[int]) -> Optional[bytes]:
    """The answer for ``count`` names before the write with the answers for
    ``positions`` after it put in their place: what one `stat` of every name after the
    write would print. None if the host's answer does not have exactly those fields."""
    fields = out.split(b"\0")
    if fields.pop() != b"" or len(fields) != FIELDS * (count + len(positions)):
        return None
    whole, fresh = fields[:FIELDS * count], fields[FIELDS * count:]
    for n, index in enumerate(positions):
        whole[FIELDS * index:FIELDS * (index + 1)] = fresh[FIELDS * n:FIELDS * (n + 1)]
    return b"\0".join(whole) + b"\0"


def quick_send(transport, needs: HostNeeds, record: dict, code_root: str, *,
               checked: bool = True, timeout: float = 60) -> Optional[dict]:
    """Write a small change with the host's shell. Returns the reply a helper stream
    would (``{rank: {"files", "bytes", "keys"}}``, and "stat": the hash of the host's
    answer for every path, when it showed them all as recorded), None when it does not fit
    this path; raises SyncError when the host could not do it (the caller then uses
    the helper).

    ``checked``: the host was just found as recorded. Else the same command checks it
    first (the record must hold the hash of its `stat` answer), and HostMoved (nothing
    written) or any error before the host said CHECKED means: compare by content."""
    files = quick_files(needs, record)
    if files is None or not (checked or record.get("stat")):
        return None
    chunks = []
    for entry in files:
        try:
            with open(os.path.join(code_root, entry.path), "rb") as handle:
                data = handle.read(entry.size + 1)
        except OSError:
            return None  # the helper's path reports an unreadable file properly
        if len(data) != entry.size:
            return None  # changed since it was hashed: let the full path sort it out
        chunks.append(data)
    names_bytes, names = record["names"], record_names(record)
    if checked:
        line, data = script(needs.root, files), b"".join(chunks) + names_bytes
    else:
        again = restated(names, files)
        line = script(needs.root, files, (len(names_bytes), record["stat"]),
                      [names[i] for i in again])
        data = names_bytes + b"".join(chunks)
    try:
        done = transport.run(line, timeout=timeout, input=data)
    except Exception as exc:  # a lost or slow connection: whether it wrote is unknown
        if checked:
            raise SyncError(f"the quick write did not complete ({exc})",
                            host=transport.host.label,
                            fix="none needed: the full sync path takes over") from None
        raise HostMoved(f"the quick check and write did not answer ({exc})",
                        host=transport.host.label,
                        fix="none needed: the sync compares by content") from None
    out = done.stdout
    if not checked:
        if not out.startswith(CHECKED):
            raise HostMoved("the host is not as the last sync left it", host=transport.host.label,
                            fix="none needed: the sync compares by content")
        out = splice(out[len(CHECKED):], len(names), again) or b""
    written = {e.path for e in files}
    expected = {entry[0]: entry[6] for entry in record_entries(record) if entry[0] not in written}
    keys = parse_stat_output(out, names) if done.ok else None
    if keys is None or any(keys[e.path][:2] != [stat.S_IFREG, e.size] for e in files):
        raise SyncError("the quick write did not complete", host=transport.host.label,
                        fix="none needed: the full sync path takes over")
    expected.update((path, keys[path]) for path in written)
    return {str(needs.rank): {"files": len(files), "bytes": sum(e.size for e in files),
                              "keys": {path: keys[path] for path in written},
                              "stat": verified_digest(out, names, expected, keys)}}
