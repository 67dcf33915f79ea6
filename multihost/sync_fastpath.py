"""The no-change fast path: a host whose tree is exactly as the last sync left it is
recognised with one `stat` command, without starting Python there.

After each complete sync of a host, the controller records, per (host, workdir, code
directory), every manifest entry with the host's stat key of it (type, size, mtime,
ctime, inode; see ``remote/sync_fs.stat_key``), the same key the host's own hash cache
trusts. The next sync first asks the host for those keys with coreutils' `stat` (one
round trip, no interpreter), while the code is hashed here: if every key is unchanged
and the manifest equals the recorded one, the host is identical and nothing else runs.
Anything else (a key that moved, an entry that differs, a `stat` without nanoseconds,
no record) falls back to the full comparison by content, which records anew.
"""
from __future__ import annotations

import hashlib
import marshal
import os
import shlex
import stat
from typing import Dict, List, Optional

from .sync_manifest import Manifest

STATE_DIR = "~/.cache/multihost/sync-state"
VERSION = 2
# Relative names in, then name, mode (hex), size, mtime, ctime, inode per path, NUL-separated.
STAT_FORMAT = r"%n\0%f\0%s\0%.9Y\0%.9Z\0%i\0"


def record_path(host_label: str, workdir: str, code_root: str) -> str:
    key = hashlib.sha256("\0".join((host_label, workdir, code_root)).encode()).hexdigest()[:24]
    return os.path.join(os.path.expanduser(STATE_DIR), key + ".state")


def load_record(host_label: str, workdir: str, code_root: str) -> Optional[dict]:
    try:
        with open(record_path(host_label, workdir, code_root), "rb") as handle:
            record = marshal.load(handle)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(record, dict) or record.get("v") != VERSION or not record.get("root"):
        return None
    return record


def save_record(host_label: str, workdir: str, code_root: str, remote_root: str,
                manifest: Manifest, keys: Dict[str, list]) -> bool:
    """Record the host's state after a complete sync; only when every entry has a key."""
    if any(entry.path not in keys for entry in manifest.entries):
        forget_record(host_label, workdir, code_root)
        return False
    record = {"v": VERSION, "root": remote_root, "digest": manifest.digest,
              "entries": [entry.wire() + [keys[entry.path]] for entry in manifest.entries]}
    path = record_path(host_label, workdir, code_root)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as handle:
            marshal.dump(record, handle)  # a cache: quick to read back, version-tagged
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
    return record.get("digest") == manifest.digest


def stat_command(remote_root: str) -> str:
    return (f"cd -- {shlex.quote(remote_root)} && "
            f"xargs -0 -r stat --printf {shlex.quote(STAT_FORMAT)} --")


def parse_stat_output(out: bytes) -> Optional[Dict[str, list]]:
    """`stat --printf STAT_FORMAT` output into {path: stat key}; None if malformed (an old
    stat without %.9Y, say)."""
    fields = out.split(b"\0")
    if fields and fields[-1] == b"":
        fields.pop()
    if len(fields) % 6:
        return None
    keys: Dict[str, list] = {}
    try:
        for i in range(0, len(fields), 6):
            name = fields[i].decode("utf-8", "surrogateescape")
            mode = int(fields[i + 1], 16)
            kind = stat.S_IFMT(mode)
            if kind == stat.S_IFDIR:
                keys[name] = [kind, mode & 0o7777]
            else:
                keys[name] = [kind, int(fields[i + 2]), _ns(fields[i + 3]), _ns(fields[i + 4]),
                              int(fields[i + 5])]
    except ValueError:
        return None
    return keys


def _ns(text: bytes) -> int:
    whole, _, fraction = text.decode().partition(".")
    if len(fraction) != 9:
        raise ValueError("no nanoseconds")
    return int(whole) * 1_000_000_000 + int(fraction)


def host_unchanged(transport, record: dict) -> bool:
    """Every recorded path still has its recorded key on the host (one `stat` call)."""
    entries: List[list] = record.get("entries", [])
    if not entries:
        return False
    names = b"\0".join(entry[0].encode("utf-8", "surrogateescape") for entry in entries)
    try:
        done = transport.run(stat_command(record["root"]), input=names, timeout=60)
    except Exception:  # any trouble here only means: compare the slow way
        return False
    if not done.ok:
        return False
    keys = parse_stat_output(done.stdout)
    if keys is None:
        return False
    return all(keys.get(entry[0]) == entry[6] for entry in entries)


def _tracked(path: str, kind: str) -> str:
    return path + "/" if kind == "d" else path


def plan_from_record(record: dict, manifest: Manifest) -> dict:
    """The plan a host would answer, worked out here: its tree is the recorded one (its
    keys were just checked), so comparing manifests is comparing trees."""
    old = {entry[0]: entry for entry in record.get("entries", [])}
    plan: Dict[str, list] = {"add": [], "change": [], "retype": [], "meta": [], "errors": []}
    for index, entry in enumerate(manifest.entries):
        prev = old.get(entry.path)
        if prev is None:
            plan["add"].append(index)
        elif prev[1] != entry.kind:
            plan["retype"].append(index)
        elif entry.kind == "d":
            if prev[3] != entry.mode:
                plan["meta"].append(index)
        elif prev[5] != entry.value or prev[2] != entry.size:
            plan["change"].append(index)
        elif entry.kind == "f" and (prev[3] != entry.mode or prev[4] != entry.mtime_ns):
            plan["meta"].append(index)
    names = {_tracked(e.path, e.kind) for e in manifest.entries}
    plan["gone"] = sorted(_tracked(p[0], p[1]) for p in old.values()
                          if _tracked(p[0], p[1]) not in names)
    plan["root"] = record["root"]
    return plan


def unchanged_keys(record: dict, manifest: Manifest, plan: dict) -> Dict[str, list]:
    """The recorded keys of the entries a plan leaves as they are."""
    touched = {manifest.entries[i].path for name in ("add", "change", "retype", "meta")
               for i in plan.get(name, [])}
    wanted = {e.path for e in manifest.entries}
    return {entry[0]: entry[6] for entry in record.get("entries", [])
            if entry[0] in wanted and entry[0] not in touched}
