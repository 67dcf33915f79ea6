"""A code directory exactly as the last walk left it, recognised without walking it.

Walking the code directory (listing every directory, deciding each entry with the
ignore rules, looking every file up in the hash cache) is most of what a sync that finds
nothing to do costs the controller: about 25 us an entry, 55 ms for 2,000 files. After a
walk, the paths its result depended on are recorded with their stat keys (type and
permission bits, size, mtime, ctime, inode):

- every directory it listed: an entry added, removed or renamed there changes the
  directory's mtime (an ignored file appearing too, so that costs a walk, never a miss);
- every entry of the manifest (ctime and inode, which no tool sets back, catch a file
  rewritten with its old size and mtime, as the hash cache does);
- every ignore file it read, even one its own rules leave out, and
  ``.git/info/exclude``, which lies outside the walk (so its absence is recorded too).

The next build lstat()s exactly those paths. If every key is the same, the recorded
manifest is the tree's. If only files moved (an edit), the recorded entries still hold
every other path and only those files are hashed again (through the hash cache);
anything else (a directory, a link, an ignore file) walks as before. A walk that saw a key too fresh
to tell a second write in the same clock tick apart records nothing (the hash cache's
"racily clean" rule): the next build goes by the older snapshot, or walks.
"""
from __future__ import annotations

import marshal
import os
import stat
from types import SimpleNamespace
from typing import List, Optional, Sequence, Tuple

from ..remote.sync_fs import CACHE_DIR, DIR, FILE, RACY_COARSE_NS, is_racy, tree_key
from .ignore import GITIGNORE, MULTIHOSTIGNORE

VERSION = 1
EXCLUDE = ".git/info/exclude"
Key = Optional[Tuple[int, int, int, int, int]]


def snapshot_path(root: str, cache_dir: Optional[str] = None) -> str:
    return os.path.join(os.path.expanduser(cache_dir or CACHE_DIR), tree_key(root) + ".tree")


def stat_keys(root: str, paths: Sequence[str]) -> List[Key]:
    """(mode, size, mtime, ctime, inode) of each path under root, None where it is gone."""
    keys: List[Key] = []
    lstat = os.lstat
    prefix = root + "/"
    for rel in paths:
        try:
            st = lstat(prefix + rel if rel else root)
        except OSError:
            keys.append(None)
            continue
        keys.append((st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return keys


def watched_paths(root: str, entries: Sequence[list]) -> List[str]:
    """What a walk's result depends on: the root, every entry (directories included),
    the ignore files present in each listed directory, and .git/info/exclude."""
    paths = ["", EXCLUDE]
    for entry in entries:
        paths.append(entry[0])
    for rel_dir in [""] + [e[0] for e in entries if e[1] == DIR]:
        for name in (GITIGNORE, MULTIHOSTIGNORE):
            rel = rel_dir + "/" + name if rel_dir else name
            if os.path.lexists(os.path.join(root, rel)):
                paths.append(rel)
    return paths


def save_snapshot(root: str, entries: Sequence[list], digest: str, walk_started_ns: int,
                  cache_dir: Optional[str] = None,
                  seen: Optional[Tuple[List[str], List[Key]]] = None) -> bool:
    """Record a walk's manifest (entries as wire lists) with the keys of what it depended
    on; nothing when a key is too fresh to trust. A snapshot that cannot be written only
    costs a walk next time. ``seen``: (paths, keys) as ``load_snapshot`` just read them,
    when only files moved (the same paths; keys read before the files were hashed again,
    so a write since then shows as a moved key next time): not read a second time."""
    if seen is not None:
        paths, keys = seen
    else:
        paths = watched_paths(root, entries)
        keys = stat_keys(root, paths)
    path = snapshot_path(root, cache_dir)
    if _any_racy(keys, walk_started_ns):
        # An older snapshot may stay: every key it holds is checked before it is believed.
        return False
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(marshal.dumps({"v": VERSION, "root": root, "paths": paths, "keys": keys,
                                        "entries": list(entries), "digest": digest}))
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def load_snapshot(root: str, cache_dir: Optional[str] = None) -> Optional[tuple]:
    """(entries as wire lists, their manifest's digest, indices of the files whose keys
    moved, (the watched paths, their keys now)) when the tree still has exactly the
    recorded entries: no directory, link or ignore file moved. Files that moved are only
    to be hashed again (the digest is then the tree's before they moved); anything else
    is None: walk."""
    try:
        with open(snapshot_path(root, cache_dir), "rb") as handle:
            data = marshal.loads(handle.read())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(data, dict) or data.get("v") != VERSION or data.get("root") != root:
        return None
    paths, keys, entries = data.get("paths"), data.get("keys"), data.get("entries")
    digest = data.get("digest")
    if not isinstance(paths, list) or not isinstance(keys, list) or len(paths) != len(keys) \
            or not isinstance(entries, list) or not isinstance(digest, str) \
            or len(paths) < len(entries) + 2:
        return None
    now = stat_keys(root, paths)
    if now == keys:   # marshal keeps the tuples
        return entries, digest, [], (paths, now)
    moved = []
    for index, (old, new) in enumerate(zip(keys, now)):
        if old == new:
            continue
        entry = index - 2                # paths: root, exclude, the entries, ignore files
        if not 0 <= entry < len(entries) or entries[entry][1] != FILE or new is None \
                or not stat.S_ISREG(new[0]):
            return None
        moved.append(entry)
    return entries, digest, moved, (paths, now)


def forget_snapshot(root: str, cache_dir: Optional[str] = None) -> None:
    _remove(snapshot_path(root, cache_dir))


def _any_racy(keys: Sequence[Key], started_ns: int) -> bool:
    """Whether a key is too fresh to trust. Only keys within the widest window of
    ``is_racy`` are asked in full: the others (nearly all) cost one comparison."""
    fresh = started_ns - RACY_COARSE_NS
    return any(is_racy(SimpleNamespace(st_mtime_ns=key[2], st_ctime_ns=key[3]), started_ns)
               for key in keys if key is not None and (key[2] >= fresh or key[3] >= fresh))


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
