"""The host side of data verification (`--data PATH`) and of `--sync-data`
(registered in ops.py). Stdlib only, Python 3.6+.

  data.scan    hashes each dataset path in parallel threads, through the per-tree hash
               cache, and answers a digest per path (and, when asked, the full listing).
               Progress lines {"progress": ...} go to stdout while it works.
  data.trash   moves files aside before --sync-data replaces or removes them: into
               ``<parent>/.<name>.multihost-trash/<time>/``, on the same filesystem, so
               nothing a user had is ever deleted.

A dataset path that is a single file is scanned as the tree of its directory holding
only that file, so files and directories travel the same way.
"""
import hashlib
import json
import os
import stat
import sys
import threading
import time

from ..sync.apply import SafeRoot
from ..sync.fs import (DIR, FILE, LINK, MODE_BITS, HashCache, UnsafePath, check_relpath,
                          default_threads, hash_files, resolve_root, scan_tree)
from .. import owners
from ..proto import OpError, reply

TRASH_SUFFIX = ".multihost-trash"
PROGRESS_EVERY = 0.5


def dataset_tree(path, base):
    """(root directory, only-this-name or None, kind) for a dataset path, or None if absent.
    The path itself may be a symlink (datasets often are); nothing below it is followed."""
    full = resolve_root(path, base)
    try:
        st = os.stat(full)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return full, None, "dir"
    parent, name = os.path.split(full)
    return parent, name, "file"


def is_trash(name):
    return name.startswith(".") and name.endswith(TRASH_SUFFIX)


def tree_digest(entries):
    """One hash for a whole listing: equal digests mean equal trees (content, not times)."""
    digest = hashlib.sha256()
    for rel, kind, size, value, _, _ in sorted(entries):
        digest.update(("%s\0%s\0%d\0%s\n" % (kind, rel, size, value)).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


class _Progress(object):
    """Called by the hashing threads as files finish; one line at a time on stdout."""

    def __init__(self, index):
        self.index = index
        self.files = self.bytes = 0
        self.last = time.time()
        self.lock = threading.Lock()

    def __call__(self, count):
        with self.lock:
            self.files += 1
            self.bytes += count
            now = time.time()
            if now - self.last >= PROGRESS_EVERY:
                self.last = now
                reply({"progress": {"path": self.index, "files": self.files, "bytes": self.bytes}})


def scan_dataset(index, path, base, verify, want_listing, threads):
    found = dataset_tree(path, base)
    if found is None:
        return {"path": path, "root": resolve_root(path, base), "exists": False}
    root, only, kind = found
    if only is not None:
        items = [(only, FILE if stat.S_ISREG(os.lstat(os.path.join(root, only)).st_mode) else LINK,
                  os.lstat(os.path.join(root, only)))]
        links = {}
        if items[0][1] == LINK:
            links[only] = os.readlink(os.path.join(root, only))
    else:
        items, links = [], {}
        skip = lambda rel, is_dir: not is_trash(rel.rpartition("/")[2])
        try:
            for rel, entry_kind, st, target in scan_tree(root, include=skip):
                if entry_kind == DIR:
                    continue
                items.append((rel, entry_kind, st))
                if entry_kind == LINK:
                    links[rel] = target
        except OSError as exc:
            raise OpError("cannot read %s: %s" % (exc.filename or root, exc.strerror),
                          fix="fix the permissions of the dataset on this host")
    cache = HashCache(os.path.join(root, only) if only else root).load()
    files = [(rel, st) for rel, entry_kind, st in items if entry_kind == FILE]
    digests, errors, (hashed_files, hashed_bytes) = hash_files(
        root, files, cache, verify=verify, threads=threads, progress=_Progress(index))
    cache.save(keep=set(rel for rel, _ in files))
    entries = []
    for rel, entry_kind, st in items:
        if entry_kind == FILE:
            value = digests.get(rel, "?unreadable")
            entries.append([rel, FILE, st.st_size, value, st.st_mode & MODE_BITS, st.st_mtime_ns])
        else:
            entries.append([rel, LINK, 0, links[rel], 0, 0])
    result = {"path": path, "root": root, "only": only, "exists": True, "kind": kind,
              "files": len(files), "bytes": sum(st.st_size for _, st in files),
              "digest": tree_digest(entries), "hashed_files": hashed_files,
              "hashed_bytes": hashed_bytes,
              "errors": sorted([rel, text] for rel, text in errors.items())[:20]}
    if want_listing:
        result["entries"] = entries
    return result


def scan(request):
    threads = int(request.get("threads") or default_threads())
    results = []
    try:
        for index, path in enumerate(request["paths"]):
            results.append(scan_dataset(index, path, request.get("base"), bool(request.get("verify")),
                                        bool(request.get("listing")), threads))
    except OpError as err:
        reply({"ok": False, "error": err.error, "fix": err.fix})
        return 1
    reply({"ok": True, "result": {"paths": results}})
    return 0


def trash(request):
    """stdin: JSON list of paths inside the dataset's root. Returns the trash dir used."""
    root = request["root"]
    names = json.loads(sys.stdin.buffer.read().decode("utf-8", "surrogateescape"))
    if not names:
        return {"moved": 0, "trash": None, "errors": []}
    parent, base = os.path.split(root.rstrip("/"))
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    trash = os.path.join(parent, "." + base + TRASH_SUFFIX, stamp)
    unsafe = owners.why_unsafe(os.path.dirname(trash))
    if unsafe:  # a trash another account planted (a link to /etc) would take our files
        raise OpError("the trash beside %s is not only yours: %s" % (root, unsafe),
                      owners.fix_for(os.path.dirname(trash), unsafe))
    source = SafeRoot(root, create=False)
    target = SafeRoot(trash, create=True)
    moved, errors = 0, []
    try:
        for rel in names:
            try:
                head, _, name = check_relpath(rel).rpartition("/")
                src_dir = source.dir_fd(head)
                dst_dir = target.dir_fd(head, create=True)
                os.rename(name, name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
                moved += 1
            except (OSError, UnsafePath) as exc:
                if len(errors) < 20:
                    errors.append([rel, getattr(exc, "strerror", None) or str(exc)])
    finally:
        source.close()
        target.close()
    return {"moved": moved, "trash": trash, "errors": errors}
