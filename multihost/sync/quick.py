"""A small edit, written by the host's own shell: no Python started there.

The usual loop is: edit a file or two, sync, run. When a host's record (sync_fastpath)
says the change is new content for a few files that are already there as regular files,
the host needs no comparison and no helper: its shell writes each file to a temporary
name next to it (`dd`, exactly its size, created with its mode by the umask), knows it
whole by the empty line that follows it on the input, sets its mtime, renames it over
the old one, and answers the `stat` of every recorded path for the next fast path.
Starting the Python helper costs a host 30-50 ms of CPU; this costs a few, and every
process counts: at 64 hosts the hosts' shells share the controller's cores.

Two ways in. Through a reused connection (and on this machine), one command does it all
(``probe_script``, run by sync_probe): started as the sync starts, it checks the host
against its record (the hash of its `stat` answer, the fast path's own check, done by
the host's `sha256sum`) while the controller is still hashing, prints CHECKED, and then
runs whatever the controller sends once it knows what changed: nothing, or the writes
(``probe_writes``). One `ssh` client and one `stat` of the tree per host, whose recorded
names it is sent once and then keeps. A host that is not as recorded writes nothing and
does not say CHECKED: it is compared by content.
Otherwise (a fresh paramiko connection) the host was checked first by the fast path and
``script`` writes and `stat`s.

Atomic as the helper is: a host sees the old file or the new one. A stream cut short
leaves a short temporary file and no empty line after it: it is never renamed, and is
removed (the shell's EXIT trap also runs on HUP, INT, TERM and PIPE). A file whose
mode is not the one sent (a default ACL overrides the umask) shows so in the host's
answer, and is rewritten by the helper. Anything else (new files, deletions,
directories, links, a type change, a host without GNU coreutils, any failure) goes the
helper's way, which is always correct: this path only ever saves time.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import stat
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from ..errors import SyncError
from ..remote.sync_fs import FILE
from .fastpath import (FIELDS, STAT_FORMAT, parse_stat_output, record_kinds, record_names,
                       recorded_keys, verified_digest)
from ..transport import quote_path

if TYPE_CHECKING:  # the probe starts before the manifest's modules are loaded
    from .manifest import Entry
    from .model import HostNeeds

MAX_FILES = 16
MAX_BYTES = 1 << 20
# The mode bits a new file gets from the umask alone (`dd` creates it 0666 less the umask).
_BY_UMASK = 0o666
# The line a host prints once it has found its tree exactly as recorded, before writing.
CHECKED = b"checked\n"
# What it prints instead when it also kept the names it was sent (see ``probe_script``).
NAMES_KEPT = b"checked; names kept\n"
# Where a host keeps them: its user's cache (each file named by ``names_file``).
NAMES_DIR = '"$HOME/.cache/multihost/names"'
_ANSWER = f"stat --printf {shlex.quote(STAT_FORMAT)} --"

# clean DIR: remove what a killed receiver left there (its pid is gone, or is now this
# shell's), as the helper does.
# put SIZE UMASK MTIME DIR NAME [MODE]: the temporary file carries this shell's pid, and is
# created exclusively (never through a link), with its mode from the umask (no `chmod`
# process; MODE only for the execute bits, which a umask cannot give). The contents
# are followed by an empty line: `dd` stops at exactly SIZE bytes or at the end of the
# input, so that line is read only when the file is whole (no `stat` process to check its
# size); a stream cut short fails here, before anything is renamed.
_FUNCTIONS = r"""t= o= c=
trap '[ -z "$t$o$c" ] || rm -f -- "$t" "$o" "$c"' EXIT
trap 'exit 1' HUP INT TERM PIPE
clean() {
  for f in "$1"/.mh-tmp.*; do
    p=${f##*/.mh-tmp.}; p=${p%%.*}
    case $p in ''|*[!0-9]*) continue;; esac
    [ "$p" != $$ ] && [ -d "/proc/$p" ] || rm -f -- "$f"   # this pid's: a killed shell's
  done
}
put() {
  t=$4/.mh-tmp.$$.$5
  umask "$2"
  if [ "$1" -gt 0 ]; then
    dd of="$t" bs="$1" count=1 iflag=fullblock conv=excl status=none || return 1
  else
    set -C; { true > "$t"; } 2>/dev/null || return 1; set +C
  fi
  IFS= read -r m && [ -z "$m" ] || return 1
  { [ -z "$6" ] || chmod "$6" -- "$t"; } && touch -m -d "@$3" -- "$t" &&
    mv -f -T -- "$t" "$4/$5" && t=
}
"""


# Where the check's answer is kept until the writes are done: a file of this shell's own,
# created exclusively (noclobber: never through a link, never one already there), without
# a `mktemp` process; `true`, not `:`, so that a name taken fails the redirection instead
# of ending the shell. Named in $o only once it is ours (the EXIT trap removes $o).
# A name taken is a probe's that was killed (SIGKILL runs no trap) and whose pid this
# shell now has: with 200 such files in a /tmp and pids wrapping at 32768, one check in
# 150 failed for that alone. That file is removed (only ours can be, in a sticky /tmp);
# what cannot be (another user's, a directory) leaves `mktemp` a name to choose.
_ANSWER_FILE = ('p="${TMPDIR:-/tmp}/mh-probe.$$"; set -C; { true > "$p"; } 2>/dev/null || '
                '{ rm -f -- "$p" 2>/dev/null; { true > "$p"; } 2>/dev/null; } || '
                'p=$(mktemp -- "${TMPDIR:-/tmp}/mh-probe.XXXXXXXX") || exit 1; set +C; o=$p')


class HostMoved(SyncError):
    """The host is not as its record says (or did not say it is): nothing was written."""


def quick_files(needs: HostNeeds, record: dict) -> Optional[Sequence[Entry]]:
    """The files of a change this path can write, or None when the helper must."""
    if needs.deletes or needs.dirs or needs.meta or needs.added or needs.errors:
        return None
    files = needs.send
    if not files or len(files) > MAX_FILES or sum(e.size for e in files) > MAX_BYTES:
        return None
    recorded = record_kinds(record)
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


def _writes(files: Sequence[Entry]) -> List[str]:
    lines = [f"clean {shlex.quote(directory)}"
             for directory in sorted({os.path.dirname(e.path) or "." for e in files})]
    for entry in files:
        directory, name = os.path.split(entry.path)
        mtime = f"{entry.mtime_ns // 1_000_000_000}.{entry.mtime_ns % 1_000_000_000:09d}"
        words = [str(entry.size), f"{0o777 & ~entry.mode:03o}", mtime, directory or ".", name]
        if entry.mode & ~_BY_UMASK:
            words.append(f"{entry.mode:o}")
        lines.append("put " + " ".join(shlex.quote(word) for word in words) + " || exit 1")
    return lines


def script(root: str, files: Sequence[Entry]) -> str:
    """Write ``files`` (their contents come first on the input, then every recorded name,
    whose `stat` answer it prints): for a host the fast path has just checked."""
    return "\n".join([f"cd -- {quote_path(root)} || exit 1", _FUNCTIONS, *_writes(files),
                      f"exec xargs -0 -r {_ANSWER}"])


def names_file(root: str, digest: str) -> str:
    """The name, in the host's NAMES_DIR, of its copy of the names ``digest`` for the
    tree at ``root``: one per root (a new one replaces the root's others), named by
    both, so that a copy is never taken for another tree's."""
    where = hashlib.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{where[:16]}-{digest[:32]}"


def probe_script(root: str, names_size: int, digest: str, keep: bool = True,
                 names: Optional[str] = None, held: bool = False) -> str:
    """Check the host, then run what comes next on the input. The input: the recorded
    names (``names_size`` bytes), unless the host holds them (``held``); then, once the
    controller knows what changed, nothing (the host was only to be checked) or a line
    with a count of lines and that many lines of shell (``probe_writes``; read by the
    shell itself, without a `dd`), followed by what those read. Nothing runs unless the
    host's `stat` answer for the names has the hash ``digest``. With ``keep``, that
    answer is kept, to be printed after the writes (every recorded path is `stat`ed
    once, not twice); without, the controller has it in the host's record
    (sync_fastpath's ``save_answer``), and it goes straight into `sha256sum`: no file,
    no `cat`, no `rm`.

    ``names``: the names' hash (sync_fastpath's ``names_digest``). Sent, they are also
    kept in the host's cache (``_keep_names``: written whole under a name of this
    shell's own, then renamed; hosts sharing a home over NFS never read a half copy),
    and it says so (NAMES_KEPT for CHECKED). The next check reads that copy: no `dd`,
    none of their bytes sent. The same `sha256sum` that hashes the `stat` answer hashes
    the copy, and both must be the expected hashes: a copy missing or altered fails the
    check (the host is compared by content, and sent the names again next time)."""
    lines = [f"cd -- {quote_path(root)} || exit 1", _FUNCTIONS]
    if names is None:
        lines += [*_check(_names_from_input(names_size), digest, keep),
                  f"printf {shlex.quote(CHECKED.decode())}"]
    elif held:
        copy = names_file(root, names)
        lines += [f'd={NAMES_DIR}', f'[ -r "$d/{copy}" ] || exit 3',
                  *_check(f'xargs -0 -r {_ANSWER} < "$d/{copy}"', digest, keep, (names, copy)),
                  f"printf {shlex.quote(CHECKED.decode())}"]
    else:
        lines += _keep_names(names_file(root, names), names_size, digest, keep)
    return "\n".join(lines + [
        "read -r n || exit 0",
        "case $n in ''|*[!0-9]*) exit 1;; esac",
        '[ "$n" -gt 0 ] || exit 0',
        "rest=",
        'while [ "$n" -gt 0 ]; do IFS= read -r line || exit 1; rest="$rest$line',
        '"; n=$((n - 1)); done',
        'eval "$rest"'])


def _keep_names(copy: str, size: int, digest: str, keep: bool) -> List[str]:
    """The check of the names on the input, kept as ``copy`` in NAMES_DIR: NAMES_KEPT
    once they are; a host whose cache cannot be written checks from its input."""
    return [
        f'd={NAMES_DIR} copy="$d/{copy}" k=',
        'if { [ -d "$d" ] || mkdir -p -m 700 -- "$d"; } 2>/dev/null &&',
        f'    dd bs={size} count=1 iflag=fullblock status=none conv=excl of="$copy.$$" '
        '2>/dev/null; then',
        'c=$copy.$$',
        *_check(f'xargs -0 -r {_ANSWER} < "$c"', digest, keep),
        # this root's copies of other names go (never another host's copy of these)
        f'set --; for f in "$d"/{copy.partition("-")[0]}-*; do',
        '  case $f in "$copy"|"$copy".*) ;; *) [ ! -e "$f" ] || set -- "$@" "$f";; esac',
        'done',
        '[ $# -eq 0 ] || rm -f -- "$@"',
        'mv -f -- "$c" "$copy" && c= && k=1',
        "else",
        *_check(_names_from_input(size), digest, keep),
        "fi",
        f'if [ -n "$k" ]; then printf {shlex.quote(NAMES_KEPT.decode())}; '
        f'else printf {shlex.quote(CHECKED.decode())}; fi']


def _names_from_input(size: int) -> str:
    return f"dd bs={size} count=1 iflag=fullblock status=none | xargs -0 -r {_ANSWER}"


def _check(answer: str, digest: str, keep: bool,
           copy: Optional[Tuple[str, str]] = None) -> List[str]:
    """The shell that runs ``answer`` (the `stat` of every recorded name) and goes on
    only if its hash is ``digest``; with ``copy`` (the names' hash, the name of the
    host's copy in "$d"), only if that copy hashes to it too: one `sha256sum` for both,
    run in "$d" so that it prints the copy's name as given."""
    if copy is None:
        hasher, expected = "sha256sum", shlex.quote(digest + "  -")
    else:
        hasher = f"{{ cd -- \"$d\" && exec sha256sum -- {copy[1]} -; }}"
        expected = shlex.quote(f"{copy[0]}  {copy[1]}\n{digest}  -")
    if not keep:
        return [f'[ "$({answer} | {hasher})" = {expected} ] || exit 3']
    hasher = f'exec < "$o" && {hasher}'   # the kept answer (before a `cd`: $o may be relative)
    return [_ANSWER_FILE, f'{answer} > "$o" || exit 1',
            f'[ "$({hasher})" = {expected} ] || exit 3']


def probe_writes(files: Sequence[Entry], again: Sequence[str], keep: bool = True) -> bytes:
    """What a probe runs to write ``files`` (their contents follow it on the input): then
    the answer kept by the check (``keep``: see ``probe_script``), and the `stat` of
    ``again`` (see ``restated``): by the shell itself (`exec`: no fork) when it has no
    answer file for its EXIT trap to remove."""
    kept = 'cat -- "$o" && ' if keep else "exec "
    text = "\n".join(_writes(files) + [
        f"{kept}{_ANSWER} " + " ".join(shlex.quote(n) for n in again), ""]).encode()
    return b"%d\n" % text.count(b"\n") + text


def restated(names: Sequence[str], files: Sequence[Entry]) -> List[int]:
    """The positions in ``names`` of the paths a write changes: each file, and the
    directory it is renamed into (its mtime moves; the code directory itself is not a
    recorded path)."""
    moved = {e.path for e in files} | {os.path.dirname(e.path) for e in files}
    return [index for index, name in enumerate(names) if name in moved]


def splice(out: bytes, count: int, positions: Sequence[int]
           ) -> Optional[Tuple[bytes, bytes, bytes, bytes]]:
    """A probe's answer cut in two: (the answer for ``count`` names before the write,
    the answer for ``positions`` (ascending) after it, the first with the second put in
    their places: what one `stat` of every name after the write would print, and what
    the first said of ``positions``). None if the host's answer does not have exactly
    those fields.

    Without splitting it: 2,300 names are 11,500 fields, and a split and joins again
    cost 1.3 ms a host (11,500 objects, and copies of a 140 KB answer, each a fresh
    page fault in a fork of the warm controller); the fields are counted in C
    (``bytes.count``, a regex for the positions' offsets) and the new answer is one
    join of slices: 0.65 ms."""
    if not out.endswith(b"\0"):
        return None
    cut = len(out) - 1
    for _ in range(FIELDS * len(positions)):   # the last fields: the answer after the write
        cut = out.rfind(b"\0", 0, cut)
    before, fresh = out[:cut + 1], out[cut + 1:]
    if before.count(b"\0") != FIELDS * count or fresh.count(b"\0") != FIELDS * len(positions):
        return None
    new = fresh.split(b"\0")
    view = memoryview(before)
    pieces, old, offset, at = [], [], 0, 0
    for n, index in enumerate(positions):
        start = _after_fields(before, offset, FIELDS * (index - at))
        end = _after_fields(before, start, FIELDS)
        pieces += [view[offset:start], b"\0".join(new[FIELDS * n:FIELDS * (n + 1)]), b"\0"]
        old.append(view[start:end])
        offset, at = end, index + 1
    pieces.append(view[offset:])
    return before, fresh, b"".join(pieces), b"".join(old)


@functools.lru_cache(maxsize=64)
def _fields(count: int):
    return re.compile(rb"(?:[^\0]*\0){%d}" % count)


def _after_fields(data: bytes, start: int, count: int) -> int:
    """The offset just past ``count`` NUL-terminated fields from ``start`` (the answer's
    fields are all counted already: there are enough)."""
    return _fields(count).match(data, start).end()


def probe_reply(label: str, needs: HostNeeds, record: dict, files: Sequence[Entry],
                out: Optional[bytes], again: Sequence[int]) -> dict:
    """``written_reply`` for a probe's output. Its answer before the write has the
    record's hash, so every path is as recorded but those at ``again``: only their
    answers, before and after the write, are read here (a Python parse of 2,000 paths
    costs more than the rest of the reply; so does unpacking the record's keys). When
    the directories show as recorded, the reply also has "answer": the host's whole
    `stat` answer after the write, which is its next record (``save_answer``)."""
    names = record_names(record)
    moved = [names[i] for i in again]
    if out is not None and "answer" in record:   # the host did not print what we have
        out = record["answer"] + out
    parts = None if out is None else splice(out, len(names), again)
    keys = keys_before = None
    if parts is not None and hashlib.sha256(parts[0]).hexdigest() == record["stat"]:
        keys, keys_before = parse_stat_output(parts[1], moved), parse_stat_output(parts[3], moved)
    if keys is None or keys_before is None or not _as_sent(parts[1], moved, files):
        raise SyncError("the quick write did not complete", host=label,
                        fix="none needed: the full sync path takes over")
    written = {e.path for e in files}
    # A directory of a written file shows as recorded (only its times moved): then the
    # answer is the record's, with the new keys of the files.
    same = all(keys[name] == keys_before[name] for name in moved if name not in written)
    node = {"files": len(files), "bytes": sum(e.size for e in files),
            "keys": {path: keys[path] for path in written},
            "stat": hashlib.sha256(parts[2]).hexdigest() if same else None}
    if same:
        node["answer"] = parts[2]
    return {str(needs.rank): node}


def _as_sent(answer: bytes, names: Sequence[str], files: Sequence[Entry]) -> bool:
    """The host's `stat` answer for ``names`` (well formed: parsed already) shows each
    file as sent: a regular file of its size and mode. The mode came from the umask,
    which a default ACL on the directory overrides: then the helper's way sets it."""
    fields = answer.split(b"\0")
    where = {name: index for index, name in enumerate(names)}
    try:
        return all(int(fields[FIELDS * where[e.path]], 16) == stat.S_IFREG | e.mode
                   and int(fields[FIELDS * where[e.path] + 1]) == e.size for e in files)
    except (KeyError, IndexError, ValueError):
        return False


def read_files(code_root: str, files: Sequence[Entry]) -> Optional[bytes]:
    """The files' contents, as hashed, as the writes read them: each followed by an empty
    line (see ``put``); None if one cannot be read or changed size (the helper's path
    reports or sorts that out)."""
    chunks = []
    for entry in files:
        try:
            with open(os.path.join(code_root, entry.path), "rb") as handle:
                data = handle.read(entry.size + 1)
        except OSError:
            return None
        if len(data) != entry.size:
            return None
        chunks.append(data)
    return b"\n".join(chunks) + b"\n" if chunks else b""


def quick_send(transport, needs: HostNeeds, record: dict, code_root: str) -> Optional[dict]:
    """Write a small change with the shell of a host the fast path has just checked.
    Returns the reply a helper stream would (``{rank: {"files", "bytes", "keys"}}``, and
    "stat": the hash of the host's answer for every path, when it showed them all as
    recorded), None when it does not fit this path; raises SyncError when the host could
    not do it (the caller then uses the helper)."""
    files = quick_files(needs, record)
    data = None if files is None else read_files(code_root, files)
    if files is None or data is None:
        return None
    done = transport.run(script(needs.root, files), input=data + record["names"], timeout=60)
    return written_reply(transport.host.label, needs, record, files,
                         done.stdout if done.ok else None)


def written_reply(label: str, needs: HostNeeds, record: dict, files: Sequence[Entry],
                  answer: Optional[bytes]) -> dict:
    """The reply for ``files`` written, from the host's `stat` answer for every recorded
    name after the write; SyncError when there is none or it does not show them."""
    names = record_names(record)
    keys = parse_stat_output(answer, names) if answer is not None else None
    if keys is None or not _as_sent(answer, names, files):
        raise SyncError("the quick write did not complete", host=label,
                        fix="none needed: the full sync path takes over")
    written = {e.path for e in files}
    expected = recorded_keys(record)
    expected.update((path, keys[path]) for path in written)
    return {str(needs.rank): {"files": len(files), "bytes": sum(e.size for e in files),
                              "keys": {path: keys[path] for path in written},
                              "stat": verified_digest(answer, names, expected, keys)}}
