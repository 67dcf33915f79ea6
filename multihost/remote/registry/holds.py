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
its owner's next write. Stdlib only, Python 3.6+.
"""
import fcntl
import json
import os
import pwd
import stat
import time

from ..run import files as run_files

DIR = "/tmp/multihost-holds"
MAX_FILE = 16384
MAX_FILES = 2000
QUEUE_STALE = 60.0      # a waiting controller refreshes its entry every few seconds
KEEP_ENDED = 86400.0    # an ended run stays listed this long (status --all)
LOCK_WAIT = 10          # seconds: writers hold the registry's flock for milliseconds
FINAL = ("succeeded", "failed", "stopped")


def holds_dir():
    return os.environ.get("MULTIHOST_HOLDS_DIR") or DIR


def me():
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return {"user": name, "uid": uid}


# -- reading: every field typed and bounded -------------------------------------------------
def _text(value, limit=255):
    return value[:limit] if isinstance(value, str) else None


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
    entry = {
        "kind": raw["kind"], "run_id": run_id, "user": user, "uid": owner_uid,
        "name": _text(raw.get("name"), 64) or "", "controller": _text(raw.get("controller")) or "",
        "gpus": _ints(raw.get("gpus"), 64), "ports": _ints(raw.get("ports"), 64) or [],
        "hosts": [h[:255] for h in hosts[:1024] if isinstance(h, str)] if isinstance(hosts, list) else [],
        "time": _number(raw.get("time")) or 0.0, "state": _text(raw.get("state"), 32) or "",
        "pid": raw.get("pid") if isinstance(raw.get("pid"), int) else None,
        "ticks": raw.get("ticks") if isinstance(raw.get("ticks"), int) else None,
        "started": _number(raw.get("started")), "ended": _number(raw.get("ended")),
        "exit_code": raw.get("exit_code") if isinstance(raw.get("exit_code"), int) else None,
        "seen": _number(raw.get("seen")), "stale_after": min(_number(raw.get("stale_after")) or 120.0, 3600.0),
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
        return run_files.is_alive(entry["pid"], entry["ticks"])
    return now - entry["time"] < entry["stale_after"]


def read_all():
    """Every entry here, typed, with ``live`` and the file's name; [] without a registry."""
    base = holds_dir()
    try:
        names = sorted(os.listdir(base))[:MAX_FILES]
    except OSError:
        return []
    now, entries = time.time(), []
    for name in names:
        if not name.endswith(".json") or not name.startswith(("run-", "queue-")):
            continue
        try:
            fd = os.open(os.path.join(base, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE:
                continue
            raw = json.loads(os.read(fd, MAX_FILE).decode("utf-8", "replace"))
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
        entry = clean(raw, info.st_uid)
        if entry is not None:
            entry["live"] = live(entry, now)
            entry["file"] = name
            entries.append(entry)
    return entries


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
class Unwritable(Exception):
    pass


def _ensure_dir():
    base = holds_dir()
    try:
        os.mkdir(base, 0o700)
        os.chmod(base, 0o1777)  # the umask would have taken the bits others need
    except FileExistsError:
        pass
    except OSError as exc:
        raise Unwritable("can not make %s: %s" % (base, exc.strerror))
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode):
        raise Unwritable("%s is not a directory" % base)
    if info.st_uid not in (0, os.getuid()) and (info.st_mode & 0o1002) != 0o1002:
        raise Unwritable("%s belongs to uid %d and is not mode 1777" % (base, info.st_uid))
    return base


class locked(object):
    """``with locked():`` the registry's flock (on the directory itself: no file that
    one user creates and another can not open)."""

    def __enter__(self):
        self.base = _ensure_dir()
        self.fd = os.open(self.base, os.O_RDONLY)
        # Bounded: any user can take this flock, and one who keeps it must not hang every
        # run's prepare on the host.
        deadline = time.time() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self.base
            except OSError:
                if time.time() > deadline:
                    os.close(self.fd)
                    raise Unwritable("%s stayed locked for %ds (a process holds its flock: "
                                     "`fuser %s` names it)" % (self.base, LOCK_WAIT, self.base))
                time.sleep(0.05)

    def __exit__(self, *exc):
        os.close(self.fd)


def file_name(kind, run_id, uid=None):
    return "%s-%d-%s.json" % (kind, os.getuid() if uid is None else uid, run_id)


def write(kind, run_id, data):
    """Write (replace) this user's entry atomically, readable by everyone."""
    base = holds_dir()
    path = os.path.join(base, file_name(kind, run_id))
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as out:
        json.dump(dict(data, kind=kind, run_id=run_id), out, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def remove(kind, run_id, uid=None):
    try:
        os.unlink(os.path.join(holds_dir(), file_name(kind, run_id, uid)))
        return True
    except OSError:
        return False


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
                os.unlink(os.path.join(holds_dir(), entry["file"]))
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
            write("run", run_id, data)
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
