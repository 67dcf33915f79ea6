"""The no-change fast path: a host whose tree is exactly as the last sync left it is
recognised with one `stat` command, without starting Python there.

After each complete sync of a host, the controller records, per (host, workdir, code
directory), every manifest entry with the host's stat key of it (type, size, mtime,
ctime, inode; see ``remote/sync/fs.stat_key``), the same key the host's own hash cache
trusts (the entries themselves once for every host synced from the same manifest: see
``save_record``). The next sync first asks the host for those keys with coreutils' `stat`
(one round trip, no interpreter) while the code is hashed here, and compares every key;
the hash of an answer found right is kept, so the checks after it compare one hash. If
nothing moved and the manifest equals the recorded one, the host is identical and
nothing else runs; a small change is sent at once by the helper's stream.
Anything else (a key that moved, an entry that differs, a `stat` without nanoseconds,
no record) falls back to the full comparison by content, which records anew.
"""
from __future__ import annotations

import hashlib
import marshal
import os
import shlex
import stat
import threading
from typing import Dict, List, Optional, Sequence

from .manifest import Manifest
from ..machines import IDENTITY_SHELL
from ..remote.sync.lock_files import FALLBACK_DIR as FALLBACK_LOCKS, MARKER, SUFFIX as LOCK_SUFFIX

STATE_DIR = "~/.cache/multihost/sync-state"
VERSION = 4
# Per path, in the order the names went in: mode (hex), size, mtime, ctime, inode.
STAT_FORMAT = r"%f\0%s\0%.9Y\0%.9Z\0%i\0"
FIELDS = 5
# Trees (see ``save_record``) kept per code directory: the newest, by last use.
TREES_KEPT = 16

# A record is two files. Hosts last synced from the same manifest share its entries and
# names (the tree: written, read and unpacked once, not once per host); each host's own
# file holds its root, its stat keys (in the names' order) and the hash of its answer.
_trees: Dict[str, dict] = {}
_trees_lock = threading.Lock()


def record_path(host_label: str, workdir: str, code_root: str) -> str:
    key = hashlib.sha256("\0".join((host_label, workdir, code_root)).encode()).hexdigest()[:24]
    return os.path.join(os.path.expanduser(STATE_DIR), key + ".state")


def tree_path(code_root: str, digest: str) -> str:
    """Named by the code directory (its trees are found and pruned together) and the
    manifest's digest (which the tree's content is)."""
    prefix = hashlib.sha256(code_root.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(os.path.expanduser(STATE_DIR), f"{prefix}-{digest[:32]}.tree")


def load_record(host_label: str, workdir: str, code_root: str) -> Optional[dict]:
    """The record of the host's last complete sync. Its keys and its tree's entries
    stay packed (see ``record_wires``, ``record_keys``): a host found unchanged never
    needs them."""
    record = _read(record_path(host_label, workdir, code_root))
    if record is None or record.get("v") != VERSION or not record.get("root") \
            or not isinstance(record.get("digest"), str) \
            or not isinstance(record.get("keys"), bytes):
        return None
    tree = _tree(tree_path(code_root, record["digest"]), record["digest"])
    if tree is None:
        return None
    record["tree"], record["names"] = tree, tree["names"]
    return record


def _read(path: str) -> Optional[dict]:
    try:
        with open(path, "rb") as handle:
            value = marshal.loads(handle.read())  # whole: load() reads object by object
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def _tree(path: str, digest: str) -> Optional[dict]:
    """The tree at ``path``, read once per process however many hosts share it."""
    with _trees_lock:
        tree = _trees.get(path)
        if tree is None:
            tree = _read(path)
            if tree is None or tree.get("v") != VERSION or tree.get("digest") != digest \
                    or not isinstance(tree.get("names"), bytes) \
                    or not isinstance(tree.get("packed"), bytes):
                return None
            tree["lock"] = threading.RLock()   # a view may be made of another
            if len(_trees) >= 4:   # a process syncs one tree at a time; a few suffice
                _trees.pop(next(iter(_trees)))
            _trees[path] = tree
    return tree


def _unpacked(tree: dict, name: str, make):
    """A view of the tree made once, by the first host that needs it."""
    with tree["lock"]:
        if name not in tree:
            tree[name] = make(tree)
        return tree[name]


def record_wires(record: dict) -> List[list]:
    """The recorded entries as ``Entry.wire`` gives them: [path, kind, size, mode, mtime,
    value], unpacked once for every host that shares them. Not to be changed."""
    def unpack(tree):
        try:
            wires = marshal.loads(tree["packed"])
        except (EOFError, ValueError, TypeError):
            return []
        return wires if isinstance(wires, list) else []

    return _unpacked(record["tree"], "wires", unpack)


def record_names(record: dict) -> List[str]:
    return _unpacked(record["tree"], "paths", lambda tree: tree["names"].decode(
        "utf-8", "surrogateescape").split("\0") if tree["names"] else [])


def record_keys(record: dict) -> List[list]:
    """The host's stat key of each recorded entry, in the names' order ([] when the
    record is damaged: then no key matches and the host is compared by content)."""
    if "unpacked" not in record:
        try:
            keys = marshal.loads(record["keys"])
        except (EOFError, ValueError, TypeError):
            keys = None
        ok = isinstance(keys, list) and len(keys) == len(record_wires(record))
        record["unpacked"] = keys if ok else []
    return record["unpacked"]


def recorded_keys(record: dict) -> Dict[str, list]:
    """{path: stat key} of every recorded entry."""
    return dict(zip(record_names(record), record_keys(record)))


def record_entries(record: dict) -> List[list]:
    """[path, kind, size, mode, mtime, value, stat key] per entry."""
    return [wire + [key] for wire, key in zip(record_wires(record), record_keys(record))]


def save_record(host_label: str, workdir: str, code_root: str, remote_root: str,
                manifest: Manifest, keys: Dict[str, list]) -> bool:
    """Record the host's state after a complete sync; only when every entry has a key.
    The manifest's entries are written once for every host synced from it."""
    try:
        host_keys = [keys[wire[0]] for wire in manifest.wires()]
    except KeyError:
        forget_record(host_label, workdir, code_root)
        return False
    if not _save_tree(code_root, manifest):
        return False
    return _write(record_path(host_label, workdir, code_root), {
        "v": VERSION, "root": remote_root, "digest": manifest.digest, "stat": None,
        "keys": marshal.dumps(host_keys)})


def _save_tree(code_root: str, manifest: Manifest) -> bool:
    """The manifest's tree, written if no host wrote it yet (else marked as used), and
    the trees of this code directory beyond the newest ``TREES_KEPT`` removed (a record
    whose tree is gone only costs its host a comparison by content)."""
    path = tree_path(code_root, manifest.digest)
    with _trees_lock:
        try:
            os.utime(path)
            return True
        except OSError:
            pass
        written = _write(path, {
            "v": VERSION, "digest": manifest.digest,
            "names": b"\0".join(e.path.encode("utf-8", "surrogateescape")
                                 for e in manifest.entries),
            "packed": marshal.dumps(manifest.wires())})
    if written:
        _prune_trees(path)
    return written


def _prune_trees(kept: str) -> None:
    directory, name = os.path.split(kept)
    prefix = name.partition("-")[0] + "-"
    try:
        trees = [os.path.join(directory, n) for n in os.listdir(directory)
                 if n.startswith(prefix) and n.endswith(".tree")]
        trees.sort(key=lambda p: os.stat(p).st_mtime_ns, reverse=True)
    except OSError:
        return
    for old in trees[TREES_KEPT:]:
        if old != kept:
            try:
                os.remove(old)
            except OSError:
                pass


def _write(path: str, record: dict) -> bool:
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as handle:
            marshal.dump(record, handle)
        os.replace(tmp, path)
    except OSError:
        return False  # a record that cannot be written costs time next time, nothing else
    return True


def forget_record(host_label: str, workdir: str, code_root: str) -> None:
    try:
        os.remove(record_path(host_label, workdir, code_root))
    except OSError:
        pass


def matches_manifest(record: dict, manifest: Manifest) -> bool:
    """The recorded entries are exactly the manifest's (paths, kinds, hashes, modes, times)."""
    return manifest.matches(record.get("digest"))


# The lock of a tree kept in the home directory (remote/sync/lock_files.py lock_path: a
# tree below /tmp, a run in place): read first, as the helper uses it once it exists.
HOME_LOCK = (f'"$HOME/{FALLBACK_LOCKS.partition("/")[2]}/$(printf %s "$PWD" | sha256sum | '
             f'cut -c1-24){LOCK_SUFFIX}"')


def stat_command(remote_root: str) -> str:
    """`stat` of the NUL-separated names on stdin, after a line of the workdir's
    generation (the first line of its lock, remote/sync/lock.py: read by the shell
    itself, '-' when there is none) and the machine's identity (machines.py: one machine
    listed twice is refused); a tree marked incomplete fails at once."""
    return (f"cd -P -- {shlex.quote(remote_root)} && test ! -e {MARKER} && "
            f"{{ {{ read -r g < {HOME_LOCK} || read -r g < \"$PWD{LOCK_SUFFIX}\"; }} "
            "2>/dev/null || g=-; } && "
            f"{IDENTITY_SHELL} && printf '%s %s\\n' \"$g\" \"$m\" && "
            f"xargs -0 -r stat --printf {shlex.quote(STAT_FORMAT)} --")


def stat_generation(out: bytes) -> str:
    """The workdir's generation an answer of ``stat_command`` starts with."""
    return out.partition(b"\n")[0].decode("ascii", "replace").partition(" ")[0]


def stat_machine(out: bytes) -> str:
    """The machine's identity (multihost/machines.py) in an answer of ``stat_command``."""
    return out.partition(b"\n")[0].decode("ascii", "replace").partition(" ")[2]


def parse_stat_output(out: bytes, names: Sequence[str]) -> Optional[Dict[str, list]]:
    """`stat --printf STAT_FORMAT` output for ``names`` (in that order, after the
    generation's line) into {path: stat key}; None if malformed (an old stat without
    %.9Y, a cut answer)."""
    out = out.partition(b"\n")[2]
    fields = out.split(b"\0")
    if fields and fields[-1] == b"":
        fields.pop()
    if len(fields) != FIELDS * len(names):
        return None
    keys: Dict[str, list] = {}
    try:
        for index, name in enumerate(names):
            i = index * FIELDS
            mode = int(fields[i], 16)
            kind = stat.S_IFMT(mode)
            if kind == stat.S_IFDIR:
                keys[name] = [kind, mode & 0o7777]
            else:
                keys[name] = [kind, int(fields[i + 1]), _ns(fields[i + 2]), _ns(fields[i + 3]),
                              int(fields[i + 4])]
    except ValueError:
        return None
    return keys


def _ns(text: bytes) -> int:
    whole, _, fraction = text.decode().partition(".")
    if len(fraction) != 9:
        raise ValueError("no nanoseconds")
    return int(whole) * 1_000_000_000 + int(fraction)


def verified_digest(out: bytes, names: Sequence[str], keys: Dict[str, list],
                    found: Optional[Dict[str, list]] = None) -> Optional[str]:
    """The hash of a `stat` answer that shows every path with exactly ``keys``, else None
    (``found``: the answer already parsed)."""
    found = parse_stat_output(out, names) if found is None else found
    if found is None or any(found.get(name) != keys.get(name) for name in names):
        return None
    return hashlib.sha256(out).hexdigest()


def host_unchanged(transport, record: dict, timeout: float = 60) -> bool:
    """Every recorded path still has its recorded key on the host (one `stat` call).

    The answer is compared by its hash when the record has one; else it is parsed and
    checked key by key, and its hash kept in ``record`` (``record["fresh"]``: to be saved)."""
    if not record["names"]:
        return False
    try:
        done = transport.run(stat_command(record["root"]), input=record["names"], timeout=timeout)
    except Exception:  # any trouble here only means: compare the slow way
        return False
    if not done.ok:
        return False
    # Whatever is sent from the record is applied only at this generation: a sync that
    # wrote the host meanwhile makes that stream refused (remote/sync/lock.py).
    record["gen"], record["machine"] = stat_generation(done.stdout), stat_machine(done.stdout)
    if record.get("stat") and hashlib.sha256(done.stdout).hexdigest() == record["stat"]:
        return True
    digest = verified_digest(done.stdout, record_names(record), recorded_keys(record))
    if digest is None:
        return False
    record["stat"], record["fresh"] = digest, True
    return True


def remember_check(host_label: str, workdir: str, code_root: str, record: dict) -> None:
    """Keep the hash a check just learned, so the next one parses nothing."""
    if record.pop("fresh", False):
        _write(record_path(host_label, workdir, code_root),
               {k: record[k] for k in ("v", "root", "digest", "stat", "keys") if k in record})


def adopt_record(checker_label: str, host_label: str, workdir: str, code_root: str) -> None:
    """A host of a shared workdir counted as verified by another host's check takes that
    host's record as its own: its next sync checks it by its own `stat` (the hash of the
    answer is its own to learn: the answer names the machine)."""
    record = _read(record_path(checker_label, workdir, code_root))
    if record is None:
        forget_record(host_label, workdir, code_root)
        return
    record["stat"] = None
    _write(record_path(host_label, workdir, code_root), record)


def _tracked(path: str, kind: str) -> str:
    return path + "/" if kind == "d" else path


def plan_from_record(record: dict, manifest: Manifest) -> dict:
    """The plan a host would answer, worked out here: its tree is the recorded one (its
    keys were just checked), so comparing manifests is comparing trees. Also "kept":
    the positions in the record of the entries it leaves as they are (see
    ``unchanged_keys``), worked out here once for every host that shares the plan."""
    plan: Dict[str, list] = {"add": [], "change": [], "retype": [], "meta": [], "errors": []}
    old = {wire[0]: (position, wire) for position, wire in enumerate(record_wires(record))}
    kept = []
    for index, entry in enumerate(manifest.entries):
        position, prev = old.get(entry.path, (None, None))
        if not _sort_entry(plan, index, prev, entry):
            kept.append(position)
    names = {_tracked(e.path, e.kind) for e in manifest.entries}
    plan["gone"] = sorted(_tracked(p[0], p[1]) for _, p in old.values()
                          if _tracked(p[0], p[1]) not in names)
    plan["root"], plan["kept"] = record["root"], kept
    return plan


def _sort_entry(plan: Dict[str, list], index: int, prev: Optional[list], entry) -> bool:
    """File the manifest's entry ``index`` under what its host must do, given the
    recorded entry ``prev`` for its path (None: none); False when nothing (it is kept)."""
    if prev is None:
        plan["add"].append(index)
    elif prev[1] != entry.kind:
        plan["retype"].append(index)
    elif entry.kind == "d" and prev[3] != entry.mode:
        plan["meta"].append(index)
    elif entry.kind != "d" and (prev[5] != entry.value or prev[2] != entry.size):
        plan["change"].append(index)
    elif entry.kind == "f" and (prev[3] != entry.mode or prev[4] != entry.mtime_ns):
        plan["meta"].append(index)
    else:
        return False
    return True


def unchanged_keys(record: dict, plan: dict) -> Dict[str, list]:
    """The recorded keys of the entries a plan (``plan_from_record``'s) leaves as they are."""
    names, keys = record_names(record), record_keys(record)
    if len(keys) != len(names):
        return {}   # a damaged record: these entries go without keys (no record is made)
    return {names[position]: keys[position] for position in plan["kept"]}
