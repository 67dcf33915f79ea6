"""Reading trees for sync and data checks: path rules, content hashes, the hash cache,
and a walker that never follows a symlink. Stdlib only, Python 3.6+.

The controller imports this module too (as ``multihost.remote.sync_fs``), so a file
is hashed and cached by the same code on both ends of a sync.

The cache maps a path to (size, mtime, ctime, inode) -> sha256, so an unchanged tree is
stat()ed, not read. ctime and inode are in the key because no tool can set them: a file
edited by hand and given back its old mtime still gets a new ctime. A file whose times
are too fresh to tell a later same-size write apart ("racily clean", as git calls it) is
hashed but not trusted the next time.
"""
import errno
import hashlib
import marshal
import os
import stat
import threading
import time

from ..machine import host_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX host
    fcntl = None

CHUNK = 1 << 20
TMP_PREFIX = ".mh-tmp."          # a file being received; never part of a tree
CACHE_ROOT = "~/.cache/multihost"
STATE_DIR = "~/.multihost/sync"
CACHE_VERSION = 2
# Timestamps finer than a second: a later write shows within a few clock ticks.
RACY_FINE_NS = 50 * 1000 * 1000
# Filesystems with one- or two-second timestamps (FAT, some NFS): wait that long.
RACY_COARSE_NS = 2 * 1000 * 1000 * 1000
MODE_BITS = 0o777


def host_cache(name):
    """``~/.cache/multihost/<name>`` of this host: its own where hosts share the home
    (a hash cache keys inodes and times of one machine's view)."""
    return os.path.join(host_dir(CACHE_ROOT), name)


class UnsafePath(ValueError):
    """A path a sync may never write: absolute, with '..', or otherwise outside the tree."""


def check_relpath(path):
    """Return ``path`` if it is a plain relative path inside a tree, else raise."""
    if not isinstance(path, str) or not path or len(path) > 4096:
        raise UnsafePath("empty or oversized path %r" % (path,))
    if "\0" in path or path.startswith("/") or path.endswith("/"):
        raise UnsafePath("path %r is absolute or malformed" % path)
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise UnsafePath("path %r leaves the tree or is not normalized" % path)
    return path


def resolve_root(path, base=None):
    """A tree's root on this machine: ``~`` expanded, relative paths taken from ``base``
    (the workdir, else the home directory). The root itself may be a symlink: it is the
    user's choice where the tree lives. Nothing below it is ever followed."""
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        path = os.path.join(os.path.expanduser(base or "~"), path)
    return os.path.normpath(path)


def tree_key(root):
    """A file name for per-tree state: the tree's real path, hashed."""
    real = os.path.realpath(root)
    return hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def file_key(st):
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def stat_key(st):
    """What shows a path unchanged since it was recorded: its type, then size, mtime,
    ctime and inode (a file or link), or its permission bits (a directory, whose times
    change with every file a job adds). The controller reads the same list from
    `stat --printf` (sync/fastpath.py) to find an unchanged host without starting Python."""
    kind = stat.S_IFMT(st.st_mode)
    if kind == stat.S_IFDIR:
        return [kind, st.st_mode & 0o7777]
    return [kind, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def is_racy(st, started_ns):
    """True when a write just after ``st`` was taken could leave the same key."""
    coarse = st.st_ctime_ns % 1000000000 == 0
    window = RACY_COARSE_NS if coarse else RACY_FINE_NS
    return max(st.st_mtime_ns, st.st_ctime_ns) >= started_ns - window


def hash_fd(fd, buffer=None):
    """sha256 of everything readable from fd. Reads go into one reused buffer: a fresh
    bytes object per read would be a large allocation (mmap, page faults) per file.
    hashlib drops the GIL on large updates, so threads hash files in parallel."""
    digest = hashlib.sha256()
    buffer = buffer if buffer is not None else bytearray(CHUNK)
    view = memoryview(buffer)
    while True:
        count = os.readv(fd, [buffer])
        if not count:
            return digest.hexdigest()
        digest.update(view[:count])


def hash_path(path, buffer=None):
    """(hexdigest, stat before reading, changed while reading?) of a regular file."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        digest = hash_fd(fd, buffer)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    return digest, before, file_key(before) != file_key(after)


class HashCache(object):
    """Per-tree cache of content hashes on this machine, in ``~/.cache/multihost``.

    A damaged or foreign cache file is ignored (it is only a cache). Saving takes a lock
    and merges, so two syncs writing into one tree at once both keep their entries.
    """

    def __init__(self, root, cache_dir=None):
        self.root = root
        directory = os.path.expanduser(cache_dir) if cache_dir else host_cache("hashes")
        self.path = os.path.join(directory, tree_key(root) + ".cache")
        self.entries = {}
        self.fresh = {}          # entries learned in this process, saved on save()
        self.loaded = False
        self.read_count = 0      # entries in the file when it was read

    def load(self):
        self.entries = self._read()
        self.read_count = len(self.entries)
        self.loaded = True
        return self

    def _read(self):
        try:
            with open(self.path, "rb") as handle:
                data = marshal.loads(handle.read())  # whole: load() reads object by object
        except (OSError, EOFError, ValueError, TypeError):
            return {}
        if not isinstance(data, dict) or data.get("v") != CACHE_VERSION:
            return {}
        entries = data.get("e")
        return entries if isinstance(entries, dict) else {}

    def get(self, rel, st):
        entry = self.entries.get(rel)
        if entry is not None and tuple(entry[:4]) == file_key(st):
            return entry[4]
        return None

    def put(self, rel, st, digest):
        entry = file_key(st) + (digest,)
        self.entries[rel] = entry
        self.fresh[rel] = entry

    def forget(self, rel):
        self.entries.pop(rel, None)
        self.fresh[rel] = None

    def save(self, keep=None):
        """Write the cache. ``keep``: the complete set of paths the tree has now (entries
        for other paths are dropped); None merges into what is on disk instead."""
        if not self.fresh and (keep is None or (self.loaded and self.read_count == len(self.entries)
                                                and all(k in keep for k in self.entries))):
            return True  # nothing new: leave the file alone
        directory = os.path.dirname(self.path)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            with _locked(self.path + ".lock"):
                if keep is not None:
                    merged = dict((k, v) for k, v in self.entries.items() if k in keep)
                else:
                    merged = self._read()
                    for rel, entry in self.fresh.items():
                        if entry is None:
                            merged.pop(rel, None)
                        else:
                            merged[rel] = entry
                tmp = "%s.%d.tmp" % (self.path, os.getpid())
                with open(tmp, "wb") as handle:
                    marshal.dump({"v": CACHE_VERSION, "root": self.root, "e": merged}, handle)
                os.replace(tmp, self.path)
        except OSError:
            return False  # a cache that cannot be written costs time, never correctness
        self.fresh = {}
        return True


class _locked(object):
    def __init__(self, path):
        self.path = path
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def default_threads():
    return max(2, min(16, os.cpu_count() or 2))


def hash_files(root, items, cache=None, verify=False, threads=None, progress=None):
    """Hash the regular files ``items`` = [(rel, lstat)] under ``root`` in parallel.

    Returns ({rel: hexdigest}, {rel: error text}, (files, bytes) actually read). With
    ``verify`` the cache is not consulted (but is refreshed). ``progress(bytes)`` is
    called as files finish, from the worker threads.
    """
    # time_ns is 3.7+; the fallback keeps 3.6 hosts working
    started = time.time_ns() if hasattr(time, "time_ns") else int(time.time() * 1e9)  # novermin
    digests, errors, todo = {}, {}, []
    for rel, st in items:
        known = None if (verify or cache is None) else cache.get(rel, st)
        if known is None:
            todo.append((rel, st))
        else:
            digests[rel] = known
    if not todo:
        return digests, errors, (0, 0)
    # Biggest first: a large file started last would run alone at the end.
    todo.sort(key=lambda item: -item[1].st_size)
    count = min(len(todo), threads or default_threads())
    shards = [_hash_some(root, todo[i::count], started, progress) for i in range(count)]
    if count == 1:
        shards[0].run()
    else:
        # Each worker takes every count-th file of the sorted list (no queue, no lock per
        # file: for many small files that overhead is what costs, not the hashing).
        workers = [threading.Thread(target=shard.run) for shard in shards]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    read_files = read_bytes = 0
    for shard in shards:
        digests.update(shard.digests)
        errors.update(shard.errors)
        read_files += len(shard.digests)
        read_bytes += shard.bytes
        if cache is not None:
            for rel, (st, digest) in shard.trusted.items():
                cache.put(rel, st, digest)
            for rel in shard.untrusted:
                cache.forget(rel)
    return digests, errors, (read_files, read_bytes)


class _hash_some(object):
    """One worker's share of a hash_files call; results merged after the join."""

    def __init__(self, root, items, started, progress):
        self.root, self.items, self.started, self.progress = root, items, started, progress
        self.digests, self.errors, self.trusted, self.untrusted = {}, {}, {}, []
        self.bytes = 0

    def run(self):
        buffer = bytearray(CHUNK)
        for rel, _ in self.items:
            path = os.path.join(self.root, rel)
            try:
                digest, before, changed = hash_path(path, buffer)
                if changed:  # written to while we read it: read it again, once
                    digest, before, changed = hash_path(path, buffer)
            except OSError as exc:
                self.errors[rel] = exc.strerror or str(exc)
                continue
            self.digests[rel] = digest
            self.bytes += before.st_size
            if changed or is_racy(before, self.started):
                self.untrusted.append(rel)
            else:
                self.trusted[rel] = (before, digest)
            if self.progress is not None:
                self.progress(before.st_size)


FILE, LINK, DIR = "f", "l", "d"


def scan_tree(root, include=None, on_dir=None):
    """Walk ``root`` without following symlinks, in sorted order.

    Yields (rel, kind, lstat, link target or None) for regular files, symlinks and
    directories (never the root itself). ``include(rel, is_dir)`` may prune entries (a
    pruned directory is not entered); ``on_dir(rel, abspath)`` is called before a
    directory's entries are listed. Sockets, fifos and devices are skipped, as are
    files being received (``.mh-tmp.*``). Unreadable directories raise OSError.
    """
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        abs_dir = os.path.join(root, rel_dir) if rel_dir else root
        if on_dir is not None:
            on_dir(rel_dir, abs_dir)
        with os.scandir(abs_dir) as listing:
            entries = sorted(listing, key=lambda e: e.name)
        subdirs = []
        for entry in entries:
            name = entry.name
            if name.startswith(TMP_PREFIX):
                continue
            rel = rel_dir + "/" + name if rel_dir else name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished while we looked
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                if include is None or include(rel, True):
                    yield rel, DIR, st, None
                    subdirs.append(rel)
            elif stat.S_ISREG(mode):
                if include is None or include(rel, False):
                    yield rel, FILE, st, None
            elif stat.S_ISLNK(mode):
                if include is None or include(rel, False):
                    try:
                        target = os.readlink(entry.path)
                    except OSError:
                        continue
                    yield rel, LINK, st, target
        stack.extend(reversed(subdirs))
