"""Applying one sync stream to a workdir on a host (host.py reads it; apply.py
writes each entry safely). Stdlib only, Python 3.6+."""
import time

from ..proto import reply
from .apply import ApplyError, SafeRoot
from .fs import FILE, LINK, HashCache, UnsafePath, stat_key
from .plan import write_tracked

MAX_ERRORS = 50


class Receiver(object):
    """Applies one sync stream to a tree; counts, and keeps going past bad entries."""

    def __init__(self, root, keys=None, claim=None):
        self.root = root
        self.keys = keys  # {path: stat_key} of what is now in sync, when asked for
        self.claim = claim  # sync_lock.Claim: marks the tree before the first change
        self.tree = SafeRoot(root, create=True)
        self.cache = HashCache(root)  # only added to: save() merges into the file
        self.files = self.bytes = self.deleted = self.links = self.meta = 0
        self.kept = []
        self.errors = []
        self.dirs = []
        self.cleaned = set()
        self.tracked = None
        self.on_progress = None  # told (files, bytes) as they are written: a relay node's
        self.partial = 0         # bytes of the file being written

    def error(self, rel, text):
        if len(self.errors) < MAX_ERRORS:
            self.errors.append([rel, text])

    def apply(self, reader):
        while True:
            header = reader.header()
            kind, rel = header["t"], header.get("p")
            if kind == "end":
                return
            if kind == "begin":
                if self.claim is not None and header.get("part"):
                    self.claim.part = header["part"]
                continue
            if kind == "tracked":
                self.tracked = reader.tracked(header)
                continue
            if not self._marked(reader, kind, rel, header):
                continue
            try:
                self._one(reader, kind, rel, header)
            except (ApplyError, UnsafePath) as exc:
                self.error(rel, str(exc))
            except OSError as exc:
                self.error(rel, exc.strerror or str(exc))

    def _marked(self, reader, kind, rel, header):
        """The tree is marked incomplete before its first change (sync_lock); where the
        mark cannot be written (a full disk), nothing is: the entry is skipped."""
        if self.claim is None:
            return True
        try:
            self.claim.mark()
            return True
        except OSError as exc:
            if kind == FILE:
                for _ in reader.content(header["s"]):  # keep the stream in step
                    pass
            self.error(rel, "cannot mark the workdir as being written: %s"
                       % (exc.strerror or exc))
            return False

    def _one(self, reader, kind, rel, header):
        tree = self.tree
        if kind == FILE:
            parent = rel.rpartition("/")[0] if isinstance(rel, str) else ""
            if parent not in self.cleaned:  # what a receiver killed here left behind
                self.cleaned.add(parent)
                tree.clean_stale_tmp(parent)
            chunks = reader.content(header["s"])
            if self.on_progress is not None:
                chunks = self._counted(chunks)
            try:
                st = tree.write_file(rel, chunks, header["m"], header["mt"], header["h"])
            except (ApplyError, UnsafePath, OSError):
                for _ in chunks:  # keep the stream in step: skip the rest of this file
                    pass
                raise
            self.cache.put(rel, st, header["h"])  # we wrote it: trusted
            self._key(rel, st)
            self.files += 1
            self.bytes += header["s"]
            self.partial = 0
        elif kind == "d":
            tree.make_dir(rel, header["m"])
            self.dirs.append((rel, header["m"]))
        elif kind == "x":
            outcome = tree.delete(rel)
            if outcome == "deleted":
                self.deleted += 1
                self.cache.forget(rel)
            elif outcome == "kept":
                self.kept.append(rel)
        elif kind == LINK:
            self._key(rel, tree.make_link(rel, header["to"]))
            self.links += 1
        elif kind == "meta":
            st = tree.set_meta(rel, header["m"], header["mt"])
            if header.get("h"):
                self.cache.put(rel, st, header["h"])
            self._key(rel, st)
            self.meta += 1
        else:
            raise ApplyError("unknown record type %r" % kind)

    def _counted(self, chunks):
        for chunk in chunks:
            self.partial += len(chunk)
            self.on_progress(self.files, self.bytes + self.partial)
            yield chunk
        self.partial = 0

    def _key(self, rel, st):
        if self.keys is not None:
            self.keys[rel] = stat_key(st)

    def finish(self):
        for rel, mode in sorted(self.dirs, key=lambda d: -d[0].count("/")):
            try:
                self._key(rel, self.tree.finish_dir(rel, mode))
            except (OSError, ApplyError, UnsafePath) as exc:
                self.error(rel, str(exc))
        if self.tracked is not None:
            # What we could not delete stays ours, to be tried again next time.
            write_tracked(self.root, list(self.tracked) + [k + "/" for k in self.kept])
        self.cache.save()
        self.tree.close()

    def result(self):
        result = {"files": self.files, "bytes": self.bytes, "deleted": self.deleted,
                  "links": self.links, "meta": self.meta, "kept": self.kept[:MAX_ERRORS],
                  "errors": self.errors}
        if self.keys is not None:
            result["keys"] = self.keys
        return result


class Progress(object):
    """A relay node's progress on its stdout (what it has written, not what the head
    was sent), a few times a second: the controller shows each host what it holds."""

    EVERY = 0.5

    def __init__(self):
        self.last = 0.0

    def __call__(self, files, count, force=False):
        now = time.time()
        if force or now - self.last >= self.EVERY:
            self.last = now
            reply({"progress": [files, count]})
