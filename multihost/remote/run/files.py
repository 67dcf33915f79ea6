"""A run's state on a host: its directory, its JSON records and the host lock (its
processes are processes.py's). Stdlib only, Python 3.6+ (this runs on the hosts).

Layout (see docs/design.md, "State on a host"):
    ~/.multihost/lock                     one run at a time (json: run_id, supervisor)
    ~/.multihost/runs/<run_id>/spec.json  what was started (secrets masked)
                              node.json  the supervisor's record, replaced atomically
                              rank.<N>.json  one record per local rank (pid, exit)
                              launcher.log, supervisor.log, log/workerlog.<N>
"""
import fcntl
import json
import os
import signal
import time

from ..machine import host_dir
from .processes import supervisor_alive, wrapper_alive
from .states import FINAL_STATES, LAUNCH_LOST, NO_SPACE

ROOT = os.path.join("~", ".multihost")
HEX = "0123456789abcdef"


def root_dir(make=False):
    """This host's ~/.multihost (its own below a home that other hosts share); a reader
    (``make`` false) makes nothing where there is nothing yet."""
    return host_dir(ROOT, make)


def valid_run_id(run_id):
    """``YYYYmmdd-HHMMSS-xxxx`` (checked without `re`: every helper start pays imports)."""
    parts = (run_id or "").split("-")
    return (len(parts) == 3 and len(parts[0]) == 8 and len(parts[1]) == 6 and len(parts[2]) == 4
            and (parts[0] + parts[1]).isdigit() and all(c in HEX for c in parts[2]))


def run_dir(run_id):
    if not valid_run_id(run_id):
        raise ValueError("bad run id %r" % (run_id,))
    return os.path.join(root_dir(), "runs", run_id)


def private_dirs(path):
    """``mkdir -p`` where every directory made is the user's only (0700; ``makedirs``
    gives the parents it makes the umask's mode). ``~/.multihost`` and its ``runs/``, left
    open by an older version or by hand, are closed again: runs hold logs and commands."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    for directory in (root_dir(), os.path.join(root_dir(), "runs")):
        make_private(directory, 0o700)


def make_private(path, mode):
    """chmod ``path`` to ``mode`` when others (or the group) may read it; never follows a
    link placed there, and a file that went away is fine."""
    try:
        st = os.lstat(path)
        if st.st_uid == os.getuid() and st.st_mode & 0o077 and not os.path.islink(path):
            os.chmod(path, mode)
    except OSError:
        pass


def make_run_files_private(run_dir):
    """What a launcher wrote into the run (paddle's own workerlogs, torchrun's files)
    with its umask's mode becomes 0600 like the files multihost writes itself."""
    for directory in (run_dir, os.path.join(run_dir, "log")):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            make_private(path, 0o700 if os.path.isdir(path) else 0o600)


def write_json(path, data):
    """Replace ``path`` atomically (readers never see half a file); mode 0600."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, sort_keys=True)
        out.write("\n")
    os.replace(tmp, path)


def open_private(path):
    """Open a log for appending, unbuffered; a new file is the user's only (0600): a
    job's output can hold what it read from its environment."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab", 0)


LAUNCHED = "launched.json"   # written by run.launched once every node of the run runs


def launch_deadline(node):
    """When a node prepared for a run of several nodes gives up waiting for the word that
    every node launched (None: it waits for nothing: one node, or told already)."""
    timeout = node.get("launch_timeout")
    if not timeout or node.get("prepared") is None:
        return None
    return float(node["prepared"]) + float(timeout)


def launch_expired(run_dir, node, now=None):
    """True once a node's launch deadline passed without the word that all launched."""
    deadline = launch_deadline(node)
    if deadline is None or (now or time.time()) < deadline:
        return False
    return not os.path.exists(os.path.join(run_dir, LAUNCHED))


RESERVE = "reserve"
RESERVE_BYTES = 256 << 10


def make_reserve(run_dir):
    """Room kept in the run directory for the node's last record: a full disk (the ranks'
    logs filled it) must still let the supervisor say so, not die mute. Best effort."""
    try:
        with open(os.path.join(run_dir, RESERVE), "wb") as out:
            out.write(b"\0" * RESERVE_BYTES)
    except OSError:
        pass


def free_reserve(run_dir):
    try:
        os.unlink(os.path.join(run_dir, RESERVE))
    except OSError:
        pass


def no_space(run_dir):
    """True when the file system of the run directory has (next to) no room left."""
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 << 10


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def tail_lines(path, count=20, max_bytes=32768):
    """The last ``count`` lines of a file, decoded safely ([] when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").replace("\r", "\n").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one is probably cut
    return [line for line in lines if line.strip()][-count:]


def rank_records(run_dir):
    """Every rank.<N>.json of the run, by local rank."""
    records = []
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return []
    for name in names:
        if name.startswith("rank.") and name.endswith(".json"):
            rec = read_json(os.path.join(run_dir, name))
            if isinstance(rec, dict):
                records.append(rec)
    settle_killed_wrappers(run_dir, records)
    return sorted(records, key=lambda r: r.get("local_rank", 0))


def settle_killed_wrappers(run_dir, records):
    """A rank whose wrapper is gone without writing its end was killed with its wrapper
    (SIGKILL: the wrapper catches every other signal; ``kill -9`` of the process that
    matches the script hits the wrapper as often as the script). Its end is not known;
    it came before what it caused: the launcher then stopped the node's other ranks and
    exited. So it is dated just before the first of those, and is the root cause instead
    of a peer the launcher stopped."""
    dead = []
    for rec in records:
        wrapper = rec.get("wrapper")
        if rec.get("ended") is None and isinstance(wrapper, list) and len(wrapper) == 2 \
                and isinstance(wrapper[0], int) \
                and not wrapper_alive(wrapper[0], wrapper[1], rec.get("pidns")):
            dead.append(rec)
    if not dead:
        return
    node = read_json(os.path.join(run_dir, "node.json")) or {}
    after = [r["ended"] for r in records if r not in dead and r.get("ended") and r.get("signal")]
    if isinstance(node.get("ended"), (int, float)):
        after.append(node["ended"])
    when = min(after) - 0.001 if after else time.time()
    for rec in dead:
        rec.update(ended=when, signal=int(signal.SIGKILL), wrapper_killed=True)


# --- the host lock ----------------------------------------------------------------

class Busy(Exception):
    def __init__(self, holder):
        Exception.__init__(self, holder.get("run_id"))
        self.holder = holder


def lock_path():
    return os.path.join(root_dir(), "lock")


def _holder_active(holder, stale_after):
    """Is the run that holds the lock still there? A lock whose supervisor is gone, or
    which was prepared long ago and never launched, or whose run ended, is stale."""
    run_id = holder.get("run_id")
    if not valid_run_id(run_id):
        return False
    node = read_json(os.path.join(run_dir(run_id), "node.json"), {})
    if node.get("state") in FINAL_STATES:
        return False
    if node.get("supervisor"):
        return supervisor_alive(node)
    return time.time() - float(holder.get("time") or 0) < stale_after


def _locked(update):
    """Run ``update(current) -> new or None`` on the lock content under flock."""
    private_dirs(root_dir())
    fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.read(fd, 65536)
        try:
            current = json.loads(raw.decode()) if raw.strip() else {}
        except ValueError:
            current = {}
        new = update(current)
        if new is not None:
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            if new:
                os.write(fd, (json.dumps(new, sort_keys=True) + "\n").encode())
        return current
    finally:
        os.close(fd)  # releases the flock


def take_lock(run_id, stale_after=120.0):
    """Take the host lock for ``run_id`` (or take over a stale one); raise Busy."""
    def update(current):
        if current.get("run_id") not in (None, run_id) and _holder_active(current, stale_after):
            raise Busy(current)
        return {"run_id": run_id, "time": time.time(), "supervisor": None}
    return _locked(update)


def set_lock_supervisor(run_id, supervisor):
    def update(current):
        if current.get("run_id") != run_id:
            return None
        current["supervisor"] = supervisor
        return current
    _locked(update)


def release_lock(run_id):
    _locked(lambda current: {} if current.get("run_id") == run_id else None)


def python_first_on_path(env, python):
    """PATH as an activated environment has it: the job's interpreter's directory first.
    Programs shell out to `python` (PaddleRec's data pipe runs `python reader.py`); found
    elsewhere on PATH, or not at all, the child dies and its parent may not notice."""
    import shutil

    if not python:
        return env
    python = os.path.expanduser(python)
    if os.sep not in python:
        python = shutil.which(python, path=env.get("PATH") or os.defpath) or ""
    directory = os.path.dirname(os.path.abspath(python)) if python else ""
    if directory and os.path.isdir(directory):
        rest = [p for p in (env.get("PATH") or os.defpath).split(os.pathsep)
                if p and p != directory]
        env["PATH"] = os.pathsep.join([directory] + rest)
    return env
