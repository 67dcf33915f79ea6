"""Who holds this host: a registry every user of the host reads, beside each user's own
state in ~/.multihost (which other users can not read).

    /tmp/multihost-holds/              mode 1777, like /tmp: anyone adds, only the owner
                                       (or root) replaces or removes a file
        run-<uid>-<run_id>.json        a run prepared or running here (its supervisor's
                                       pid once launched), kept a day after it ends so
                                       ``status --all`` can tell how it ended
        queue-<uid>-<run_id>.json      a run waiting for this host (``run --queue``); its
                                       controller refreshes ``seen`` while it waits

/tmp because it is the one directory every Linux host lets every user write, and it is
the machine's own (a shared /var/tmp over NFS would mix hosts). A file is written
atomically (a temporary name, then rename) under a flock of the directory, so two runs
claiming the host at once see each other. Every file is another user's input: read
bounded, each field typed, anything else skipped. An entry whose supervisor is gone, or
a queue entry not refreshed for QUEUE_STALE seconds, is stale: ignored, and removed by
its owner's next write.

Another account can plant things in /tmp, so the registry is trusted only as root made
it: a directory (not a link) owned by root. One made by anyone else is not read or
written (``trouble`` says so, with a fix for root that changes nothing of hers), and a
run then keeps its entry in ``~/.multihost/holds/<hostname>``, seen by its own user's
runs only. The registry is advisory: no trouble of it ever fails a run. Names are
filtered before the count is capped (per user: junk of one user never hides another's
entries); times are clamped to now; an entry is live only while its pid is a process of
the entry's owner with the recorded start time. Stdlib only, Python 3.6+.
"""
import binascii
import json
import os
import pwd
import stat
import time
import unicodedata

from ..run import files as run_files
from ..run import processes
from .place import (DIR, Unwritable, ensure_dir as _ensure_dir, holds_dir, locked,  # noqa: F401
                    personal_dir, root_fix, shared_trouble, user_of as _user_of)

MAX_FILE = 16384
MAX_FILES = 2000        # entries read per user (a file's name says whose it is)
QUEUE_STALE = 60.0      # a waiting controller refreshes its entry every few seconds
KEEP_ENDED = 86400.0    # an ended run stays listed this long (status --all)
FINAL = ("succeeded", "failed", "stopped")
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def me():
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return {"user": name, "uid": uid}


# -- reading: every field typed and bounded -------------------------------------------------
def _text(value, limit=255):
    """Text of another user, bounded, without control characters (a newline in a name
    would print a row of her making)."""
    if not isinstance(value, str):
        return None
    return "".join(c for c in value[:limit] if unicodedata.category(c)[0] != "C")


def _run_name(value):
    """A run's --name as the controller checks it (a letter, then letters, digits, '.',
    '_' or '-', at most 64); anything else is no name."""
    if not isinstance(value, str) or not 0 < len(value) <= 64 or value[0] not in LETTERS \
            or not all(c in LETTERS or c in "0123456789._-" for c in value):
        return ""
    return value


def _number(value):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ints(value, limit=256):
    if not isinstance(value, list):
        return None
    return [v for v in value[:limit] if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 20]


def clean(raw, owner_uid):
    """One file's content as a typed entry, or None. The uid is the file's owner, not
    what the file says: a user can not write an entry in another's name."""
    if not isinstance(raw, dict) or raw.get("kind") not in ("run", "queue"):
        return None
    run_id = raw.get("run_id")
    if not run_files.valid_run_id(run_id if isinstance(run_id, str) else ""):
        return None
    try:
        user = pwd.getpwuid(owner_uid).pw_name
    except KeyError:
        user = str(owner_uid)
    hosts = raw.get("hosts")
    now = time.time()

    def when(key):  # a time from the future would hold (or queue) for ever
        value = _number(raw.get(key))
        return None if value is None else min(value, now)

    entry = {
        "kind": raw["kind"], "run_id": run_id, "user": user, "uid": owner_uid,
        "name": _run_name(raw.get("name")), "controller": _text(raw.get("controller")) or "",
        "gpus": _ints(raw.get("gpus"), 64), "ports": _ints(raw.get("ports"), 64) or [],
        "hosts": [_text(h) for h in hosts[:1024] if isinstance(h, str)] if isinstance(hosts, list) else [],
        "time": when("time") or 0.0, "state": _text(raw.get("state"), 32) or "",
        "pid": raw.get("pid") if isinstance(raw.get("pid"), int) and not isinstance(raw.get("pid"), bool) else None,
        "ticks": raw.get("ticks") if isinstance(raw.get("ticks"), int) else None,
        "started": when("started"), "ended": when("ended"),
        "exit_code": raw.get("exit_code") if isinstance(raw.get("exit_code"), int) else None,
        "seen": when("seen"), "stale_after": min(_number(raw.get("stale_after")) or 120.0, 3600.0),
    }
    return entry


def live(entry, now=None):
    """Does this entry still hold (or wait for) the host?"""
    now = time.time() if now is None else now
    if entry["kind"] == "queue":
        return now - (entry["seen"] or 0) < QUEUE_STALE
    if entry["state"] in FINAL:
        return False
    if entry["uid"] == os.getuid():
        # One's own run: its node.json turns final a moment before its supervisor marks
        # the entry (the controller may already have moved on to the next run).
        node = run_files.read_json(os.path.join(run_files.run_dir(entry["run_id"]), "node.json"))
        if isinstance(node, dict) and node.get("state") in FINAL:
            return False
    if entry["pid"]:
        # Her entry naming pid 1, or a pid of ours, holds nothing: the process must be
        # the owner's, with the start time recorded.
        return entry["ticks"] is not None and _owner_uid(entry["pid"]) == entry["uid"] and \
            processes.is_alive(entry["pid"], entry["ticks"])
    return now - entry["time"] < entry["stale_after"]


def _owner_uid(pid):
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except (OSError, ValueError, OverflowError):
        return None


def read_all():
    """Every entry here, typed, with ``live``, its file's name and directory; [] without
    a registry."""
    return scan()[0]


def scan():
    """(entries, trouble): every entry of the host registry (when it can be trusted) and
    of this user's own fallback; trouble: what a user should hear (a registry not used,
    one over-full)."""
    trouble, entries = [], []
    problem = shared_trouble()
    if problem:
        trouble.append({"text": problem, "fix": root_fix(holds_dir())})
    else:
        entries += _read_dir(holds_dir(), trouble)
    personal = personal_dir()
    if personal != holds_dir() and os.path.isdir(personal):
        entries += [e for e in _read_dir(personal, trouble) if e["uid"] == os.getuid()]
    return entries, trouble


def _read_dir(base, trouble):
    try:
        names = os.listdir(base)
    except OSError:
        return []
    per_user = {}
    for name in names:   # filtered before any cap: junk names count for nothing
        uid = _name_uid(name)
        if uid is not None:
            per_user.setdefault(uid, []).append(name)
    now, entries = time.time(), []
    for uid, mine in sorted(per_user.items()):
        if len(mine) > MAX_FILES:
            trouble.append({
                "text": "the host registry %s holds %d entries of %s: only %d were read"
                        % (base, len(mine), _user_of(uid), MAX_FILES),
                "fix": "as root on that host: `find %s -maxdepth 1 -user %d -delete` (or ask %s)"
                       % (base, uid, _user_of(uid))})
        for name in sorted(mine)[:MAX_FILES]:
            entry = _read_one(base, name, uid)
            if entry is not None:
                entry["live"] = live(entry, now)
                entry["file"], entry["dir"] = name, base
                entries.append(entry)
    return entries


def _name_uid(name):
    """The uid an entry's file name gives (``run-<uid>-<run id>.json``), or None for a
    name that is not an entry's."""
    kind, _, rest = name.partition("-")
    uid, _, tail = rest.partition("-")
    if kind not in ("run", "queue") or not tail.endswith(".json") or \
            not run_files.valid_run_id(tail[:-5]) or not uid or len(uid) > 10 or \
            any(c not in "0123456789" for c in uid):
        return None
    return int(uid)


def _read_one(base, name, uid):
    try:
        fd = os.open(os.path.join(base, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE or info.st_uid != uid:
            return None   # a file named for another user than its owner is a forgery
        raw = json.loads(os.read(fd, MAX_FILE).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return clean(raw, info.st_uid)


# -- conflicts and words ------------------------------------------------------------------
def overlaps(gpus_a, gpus_b, ports_a=(), ports_b=()):
    """Two runs on one host collide unless both name GPUs and share none (a run without
    GPUs takes the whole host, as the one-run-per-host rule always did), and their ports
    are apart."""
    if set(ports_a or ()) & set(ports_b or ()):
        return True
    if not gpus_a or not gpus_b:
        return True
    return bool(set(gpus_a) & set(gpus_b))


def fold_ints(values):
    """[0,1,2,3,6] -> '0-3,6'."""
    values, parts = sorted(set(values or ())), []
    start = prev = None
    for v in values + [None]:
        if v is not None and prev is not None and v == prev + 1:
            prev = v
            continue
        if start is not None:
            parts.append(str(start) if start == prev else "%d-%d" % (start, prev))
        start = prev = v
    return ",".join(parts)


def age(seconds):
    seconds = max(0, int(seconds))
    if seconds < 60:
        return "%ds" % seconds
    if seconds < 3600:
        return "%dm" % (seconds // 60)
    if seconds < 86400:
        return "%dh %dm" % (seconds // 3600, seconds % 3600 // 60)
    return "%dd %dh" % (seconds // 86400, seconds % 86400 // 3600)


def run_words(entry):
    """``alice's run "bert-large" (run 20261127-110200-ab12``: who and which."""
    if entry.get("name"):
        return '%s\'s run "%s" (run %s' % (entry["user"], entry["name"], entry["run_id"])
    return "%s's run %s (" % (entry["user"], entry["run_id"])


def holder_line(entry, now=None):
    """``alice's run "bert-large" (run 2026..., since 2h 10m, GPUs 0-7)``."""
    now = time.time() if now is None else now
    since = entry.get("started") or entry.get("time") or now
    gpus = ("GPUs " + fold_ints(entry["gpus"])) if entry.get("gpus") else "no GPUs"
    words = run_words(entry)
    sep = "" if words.endswith("(") else ", "
    return "%s%ssince %s, %s)" % (words, sep, age(now - since), gpus)


# -- writing: under the directory's flock -------------------------------------------------
def file_name(kind, run_id, uid=None):
    return "%s-%d-%s.json" % (kind, os.getuid() if uid is None else uid, run_id)


def write(kind, run_id, data, base=None):
    """Write (replace) this user's entry atomically, readable by everyone, through a
    temporary name nobody can guess (one planted in its place would fail the write)."""
    base = base or _ensure_dir()
    path = os.path.join(base, file_name(kind, run_id))
    tmp = os.path.join(base, ".%s.tmp" % binascii.hexlify(os.urandom(12)).decode())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as out:
        json.dump(dict(data, kind=kind, run_id=run_id), out, sort_keys=True)
        os.fchmod(out.fileno(), 0o644)
    os.replace(tmp, path)


def remove(kind, run_id, uid=None):
    gone = False
    for base in (holds_dir(), personal_dir()):
        try:
            os.unlink(os.path.join(base, file_name(kind, run_id, uid)))
            gone = True
        except OSError:
            pass
    return gone


def read_own(kind, run_id):
    for entry in read_all():
        if entry["kind"] == kind and entry["run_id"] == run_id and entry["uid"] == os.getuid():
            return entry
    return None


def prune(entries, now=None):
    """Remove what this user may: its own stale entries (root: anyone's), its ended runs
    after KEEP_ENDED."""
    now = time.time() if now is None else now
    uid = os.getuid()
    for entry in entries:
        if uid not in (0, entry["uid"]):
            continue
        ended = entry["kind"] == "run" and entry["state"] in FINAL
        if (ended and now - (entry["ended"] or entry["time"]) > KEEP_ENDED) or \
                (not entry["live"] and not ended):
            try:
                os.unlink(os.path.join(entry.get("dir") or holds_dir(), entry["file"]))
            except OSError:
                pass


def update(run_id, **fields):
    """Change this user's entry for ``run_id`` (nothing when there is none)."""
    try:
        with locked():
            entry = read_own("run", run_id)
            if entry is None:
                return
            data = dict((k, entry[k]) for k in ("name", "controller", "gpus", "ports", "hosts",
                                                "time", "state", "pid", "ticks", "started",
                                                "ended", "exit_code", "stale_after"))
            data.update(fields)
            write("run", run_id, data, entry.get("dir"))
    except (Unwritable, OSError):
        pass  # the registry is advisory to others: never the reason a run fails


def supervised(run_id, pid, ticks):
    update(run_id, pid=pid, ticks=ticks, state="running", started=time.time())


def ended(run_id):
    """The run ended here (any way): its final state and exit code from node.json."""
    if not run_files.valid_run_id(run_id if isinstance(run_id, str) else ""):
        return
    node = run_files.read_json(os.path.join(run_files.run_dir(run_id), "node.json"), {}) or {}
    state = node.get("state") if node.get("state") in FINAL else "stopped"
    code = node.get("exit_code") if isinstance(node.get("exit_code"), int) else None
    update(run_id, state=state, exit_code=code, ended=time.time())
