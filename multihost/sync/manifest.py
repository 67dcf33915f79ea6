"""The controller's side of a sync: what the code directory holds, by content.

A manifest lists every directory, file and symlink that travels (ignore rules applied)
with its size, mode, mtime and sha256 (a link: its target). Hashes come from a cache
keyed by (path, size, mtime, ctime, inode) in ``~/.cache/multihost/hashes``, so an
unchanged tree is only stat()ed. The same code hashes the hosts' trees
(``remote/sync/fs.py``), so both sides agree on what "the same" means.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import threading
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..errors import ConfigError, SyncError
from ..remote.sync.fs import DIR, FILE, LINK, MODE_BITS, HashCache, hash_files, scan_tree
from .ignore import IgnoreRules

# Above these, data has probably got into the code directory: say so (never refuse).
WARN_FILES = 20_000
WARN_BYTES = 500 * 1024 * 1024
_DIGEST_LOCK = threading.Lock()


class Entry(NamedTuple):
    """One path of the tree (a named tuple: its ``wire`` form is what hosts and records
    read)."""
    path: str
    kind: str            # "f" file, "l" symlink, "d" directory
    size: int
    mode: int            # permission bits only
    mtime_ns: int
    value: str           # sha256 of a file, target of a link, "" for a directory

    def wire(self) -> list:
        return list(self)


@dataclass(frozen=True)
class Manifest:
    root: str
    entries: Tuple[Entry, ...]
    rules: IgnoreRules = field(compare=False, repr=False)
    hashed_files: int = 0           # files read this time (not answered by the cache)
    hashed_bytes: int = 0

    # Counted once: the scan's event, the report and the size warnings each ask.
    @functools.cached_property
    def files(self) -> int:
        """Files and symlinks (as rsync counts them); directories are not counted."""
        return sum(1 for e in self.entries if e.kind != DIR)

    @functools.cached_property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == FILE)

    def paths(self) -> Dict[str, Entry]:
        return {e.path: e for e in self.entries}

    def wires(self) -> List[list]:
        """Every entry as ``Entry.wire`` gives it, made once (the digest, the host
        records and the plan's payload all want them). Not to be changed."""
        cached = self.__dict__.get("_wires")
        if cached is None:
            cached = [e.wire() for e in self.entries]
            object.__setattr__(self, "_wires", cached)
        return cached

    @property
    def digest(self) -> str:
        """One hash of every entry (path, kind, size, mode, mtime, content hash). Worked
        out once: the hosts' threads that want it together wait for the first."""
        cached = self.__dict__.get("_digest")
        if cached is None:
            with _DIGEST_LOCK:
                cached = self.__dict__.get("_digest")
                if cached is None:
                    cached = wires_digest(self.wires())
                    object.__setattr__(self, "_digest", cached)
        return cached

    def matches(self, digest: Optional[str]) -> bool:
        """Whether the tree ``digest`` names is exactly this manifest."""
        return bool(digest) and digest == self.digest

    def encode(self) -> bytes:
        """What a host's sync_plan reads on stdin: zlib-compressed JSON."""
        body = json.dumps({"entries": self.wires()}, separators=(",", ":"))
        return zlib.compress(body.encode("utf-8", "surrogateescape"), 1)


def wires_digest(wires: Sequence[list]) -> str:
    """``Manifest.digest`` of the entries ``wires`` (as ``Entry.wire`` gives them)."""
    body = json.dumps(wires, separators=(",", ":"))
    return hashlib.sha256(body.encode("utf-8", "surrogateescape")).hexdigest()


def code_root(code_dir: str) -> str:
    """The code directory's absolute path; a ConfigError when it is not a directory."""
    root = os.path.abspath(os.path.expanduser(code_dir))
    if not os.path.isdir(root):
        raise ConfigError(f"code directory {code_dir} does not exist or is not a directory",
                          fix="run from your project directory or give --code DIR")
    return root


def build_manifest(code_dir: str, *, verify: bool = False,
                   cache_dir: Optional[str] = None) -> Manifest:
    """Walk and hash the code directory. Anything unreadable is an error, never a skip:
    a file missing from the manifest would be deleted on the hosts."""
    root = code_root(code_dir)
    rules = IgnoreRules(root)
    found: List[Tuple[str, str, os.stat_result, Optional[str]]] = []
    try:
        for rel, kind, st, target in scan_tree(root, include=rules.included, on_dir=rules.enter):
            found.append((rel, kind, st, target))
    except OSError as exc:
        where = os.path.relpath(exc.filename, root) if exc.filename else code_dir
        raise SyncError(f"cannot read {where} in the code directory: {exc.strerror}",
                        fix=f"fix its permissions, or add it to {root}/.multihostignore") from None
    cache = HashCache(root, cache_dir).load()
    files = [(rel, st) for rel, kind, st, _ in found if kind == FILE]
    digests, errors, (hashed_files, hashed_bytes) = hash_files(root, files, cache, verify=verify)
    if errors:
        rel, text = sorted(errors.items())[0]
        raise SyncError(f"cannot read {rel} in the code directory: {text}",
                        fix=f"fix its permissions, or add it to {root}/.multihostignore")
    cache.save(keep={rel for rel, _ in files})
    entries = []
    for rel, kind, st, target in found:
        mode = st.st_mode & MODE_BITS
        if kind == FILE:
            entries.append(Entry(rel, FILE, st.st_size, mode, st.st_mtime_ns, digests[rel]))
        elif kind == LINK:
            entries.append(Entry(rel, LINK, 0, 0, 0, target or ""))
        else:
            entries.append(Entry(rel, DIR, 0, mode, 0, ""))
    return Manifest(root, tuple(entries), rules, hashed_files, hashed_bytes)


def size_warnings(manifest: Manifest) -> Tuple[str, ...]:
    """A warning when the code directory looks like it holds data, naming the biggest
    top-level entries so the user knows what to ignore."""
    files, total = manifest.files, manifest.bytes
    if files <= WARN_FILES and total <= WARN_BYTES:
        return ()
    per_top: Dict[str, List[int]] = {}
    for entry in manifest.entries:
        if entry.kind == FILE:
            top = entry.path.split("/", 1)[0] + ("/" if "/" in entry.path else "")
            counts = per_top.setdefault(top, [0, 0])
            counts[0] += 1
            counts[1] += entry.size
    biggest = sorted(per_top.items(), key=lambda item: -item[1][1])[:3]
    named = ", ".join(f"{name} ({human_bytes(size)}, {count} files)"
                      for name, (count, size) in biggest)
    return (f"the code directory holds {files} files, {human_bytes(total)}: is data in it? "
            f"largest: {named}. Add what the job does not need to .multihostignore.",)


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000.0
    return f"{count:.1f} TB"


def code_revision(code_dir: str) -> Tuple[Optional[str], bool]:
    """(git commit of the code directory or None, whether the tree differs from it).

    Untracked files that are not ignored make the tree dirty too: they travel with the
    sync, so the commit alone would not say what ran.
    """
    if not _inside_git_work_tree(code_dir):  # the common answer for a copy of code,
        return None, False                     # without a `git` process on every sync

    def git(*args: str) -> Optional[str]:
        try:
            done = subprocess.run(["git", "-C", code_dir, *args], capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "--verify", "-q", "HEAD")
    if not commit:
        return None, False
    status = git("status", "--porcelain", "--untracked-files=normal")
    return commit.strip(), bool(status and status.strip())


def _inside_git_work_tree(code_dir: str) -> bool:
    """Whether git could find a repository for ``code_dir``: a `.git` (directory or file)
    in it or a parent, or git told where one is through its environment."""
    if any(name in os.environ for name in ("GIT_DIR", "GIT_WORK_TREE")):
        return True
    path = os.path.abspath(code_dir)
    while True:
        if os.path.lexists(os.path.join(path, ".git")):
            return True
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
