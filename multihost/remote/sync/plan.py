"""Comparing the controller's manifest with a tree on this host. Stdlib only, 3.6+.

The answer lists, by index into the manifest, what to add, change, re-type (a file
where a directory is, ...) or only re-stamp (mode, mtime), with content hashes from the
host's cache. Which paths are "ours" (put here by a sync) is remembered per tree in
~/.multihost/sync/, so that only those are ever deleted.
"""
import json
import os
import stat
import zlib

from .apply import SafeRoot
from ..machine import host_dir
from .fs import (DIR, FILE, LINK, MODE_BITS, STATE_DIR, HashCache, UnsafePath,
                          check_relpath, hash_files, resolve_root, stat_key, tree_key)
from ..proto import OpError

_IFMT = {FILE: stat.S_IFREG, LINK: stat.S_IFLNK, DIR: stat.S_IFDIR}
# In place of a manifest's length: the workdir is not there, the entries' count follows.
NO_MANIFEST = 0xFFFFFFFF


def _state_path(root):
    return os.path.join(host_dir(STATE_DIR), tree_key(root) + ".json")


def read_tracked(root):
    try:
        with open(_state_path(root)) as handle:
            data = json.load(handle)
        return list(data.get("paths", []))
    except (OSError, ValueError, AttributeError):
        return []


def write_tracked(root, paths):
    path = _state_path(root)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as handle:
        json.dump({"root": root, "paths": sorted(set(paths))}, handle, separators=(",", ":"))
    os.replace(tmp, path)


def _tracked_name(rel, kind):
    return rel + "/" if kind == DIR else rel


def make_plan(request, payload):
    """Compare the controller's manifest (zlib JSON) with the tree at request["root"]."""
    root = resolve_root(request["root"], request.get("base"))
    try:
        manifest = json.loads(zlib.decompress(payload).decode("utf-8", "surrogateescape"))
    except (ValueError, zlib.error):
        raise OpError("the manifest sent by the controller is unreadable",
                      fix="run the sync again; check that nothing writes to the ssh session")
    entries = manifest["entries"]
    names = set(_tracked_name(e[0], e[1]) for e in entries)
    tracked = read_tracked(root)
    # "gone": put here by a sync, no longer in the manifest: the controller decides which
    # of them to delete (not those its ignore rules now leave out).
    result = {"root": root, "add": [], "change": [], "retype": [], "meta": [], "errors": [],
              "gone": sorted(set(tracked) - names), "hashed_files": 0, "hashed_bytes": 0}
    if not os.path.isdir(root):
        if os.path.lexists(root):
            raise OpError("%s exists and is not a directory" % root,
                          fix="move it away or choose another --workdir")
        return absent_plan(request, len(entries))
    result["exists"] = True
    tree = SafeRoot(root, create=False)
    cache = HashCache(root).load()
    to_hash, candidates, stats = [], [], {}
    # A workdir another host of this sync has just written (it shares it): a file of the
    # manifest's size and time is the one that host wrote and stamped; only the others
    # are read (hashing the tree once per host made a shared workdir cost N reads).
    written = bool(request.get("written")) and not request.get("verify")
    try:
        for index, (rel, kind, size, mode, mtime, value) in enumerate(entries):
            try:
                st = tree.lstat(check_relpath(rel))
            except UnsafePath as exc:
                result["errors"].append([rel, str(exc)])
                continue
            stats[index] = st
            if st is None:
                result["add"].append(index)
            elif stat.S_IFMT(st.st_mode) != _IFMT[kind]:
                result["retype"].append(index)  # a file where a directory was, ...
            elif kind == DIR:
                if st.st_mode & MODE_BITS != mode:
                    result["meta"].append(index)
            elif kind == LINK:
                if _readlink(root, rel) != value:
                    result["change"].append(index)
            elif st.st_size != size:
                result["change"].append(index)
            elif written and _stamped(st.st_mtime_ns, mtime):
                if st.st_mode & MODE_BITS != mode:  # a time cut to the second stays cut
                    result["meta"].append(index)
            else:
                to_hash.append((rel, st))
                candidates.append((index, st, mode, mtime, value))
        digests, errors, read = hash_files(root, to_hash, cache, verify=bool(request.get("verify")))
        for index, st, mode, mtime, value in candidates:
            rel = entries[index][0]
            if digests.get(rel) != value:
                result["change"].append(index)
            elif st.st_mode & MODE_BITS != mode or st.st_mtime_ns != mtime:
                result["meta"].append(index)
        result["hashed_files"], result["hashed_bytes"] = read
        if request.get("keys"):
            # What is in sync already, as the controller will record it (sync/fastpath.py).
            unsettled = set(result["add"] + result["change"] + result["retype"] + result["meta"])
            result["keys"] = dict((entries[i][0], stat_key(st)) for i, st in stats.items()
                                  if st is not None and i not in unsettled)
        result["errors"].extend([rel, text] for rel, text in sorted(errors.items()))
        result["change"].sort()
        if not request.get("dry_run"):
            cache.save(keep=set(rel for rel, _ in to_hash))
            # Every path of the manifest is ours from now on (sent now, or already equal).
            if not names <= set(tracked):
                write_tracked(root, names | set(tracked))
    finally:
        tree.close()
    return result


def _stamped(found_ns, manifest_ns):
    """The time the writer stamped, as this host's filesystem keeps it: to the
    nanosecond, or cut to the whole second (sshfs keeps whole seconds only)."""
    return found_ns == manifest_ns or found_ns == manifest_ns - manifest_ns % 1000000000


def absent_plan(request, count):
    """The plan of a workdir that is not there: add all ``count`` entries. It needs no
    manifest, so a first sync is planned without one (the controller sends their number
    only). Nothing is gone: what a sync once put there went with the workdir."""
    root = resolve_root(request["root"], request.get("base"))
    result = {"root": root, "add": list(range(count)), "change": [], "retype": [], "meta": [],
              "errors": [], "gone": [], "hashed_files": 0, "hashed_bytes": 0, "exists": False}
    if request.get("keys"):
        result["keys"] = {}
    return result


# What the controller's shared-directory probe (sync/shared.py) makes in a workdir before
# a sync, named here for both sides: a workdir holding only that has nothing of a tree yet.
SHARE_DIR = ".multihost-share"


def workdir_absent(request):
    """True when the request's workdir holds nothing yet (a first sync): it does not
    exist, or it is a directory the sharing probe just made, holding only its tokens.
    Such a host is sent no manifest, only the number of entries."""
    try:
        root = resolve_root(request["root"], request.get("base"))
        if not os.path.lexists(root):
            return True
        return (not os.path.islink(root) and os.path.isdir(root)
                and set(os.listdir(root)) <= {SHARE_DIR})
    except (KeyError, TypeError, ValueError, OSError):
        return False  # the full plan reports what is wrong with the request


def _readlink(root, rel):
    try:
        return os.readlink(os.path.join(root, rel))
    except OSError:
        return None
