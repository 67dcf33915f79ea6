"""``stacks.dump``: the Python stack of every live rank of a run on this host.

With py-spy on the PATH, ``py-spy dump --pid`` (no cooperation from the rank needed).
Without it, the stack hook the rank wrapper put into each rank (stackhook.py): the
rank's stacks file grows by faulthandler's dump when STACK_SIGNAL comes; only what was
added after the signal is read. A rank whose hook is not in (not Python, or ``python -I``)
is never signalled: that signal's default action would end it.
"""
import os
import shutil
import signal
import subprocess
import time

from . import files as run_files
from . import processes
from .ops import _run_dir
from ..proto import op

STACK_SIGNAL = getattr(signal, "SIGRTMIN", 34) + 4
MARKER = "# multihost stack hook pid %d\n"
MAX_BYTES = 256 * 1024


def _settled(path, offset, wait):
    """The text added to ``path`` after ``offset``, once it stops growing (or '')."""
    deadline = time.time() + wait
    last, steady = -1, 0
    while time.time() < deadline:
        size = os.path.getsize(path)
        if size > offset and size == last:
            steady += 1
            if steady >= 2:
                break
        else:
            steady = 0
        last = size
        time.sleep(0.1)
    with open(path, "rb") as source:
        source.seek(offset)
        return source.read(MAX_BYTES).decode("utf-8", "replace")


def _head(run_dir, local_rank):
    try:
        with open(os.path.join(run_dir, "stacks.%d" % local_rank), "rb") as source:
            return source.read(200).decode("utf-8", "replace")
    except OSError:
        return ""


def _hook_pid(head):
    """The pid the stack hook wrote in its marker line (the rank's own view of it)."""
    prefix = MARKER.split("%d")[0]
    for line in head.splitlines():
        if (line + "\n").startswith(prefix) and line[len(prefix):].strip().isdigit():
            return int(line[len(prefix):].strip())
    return None


def in_container(run_dir, run_id, record):
    """A rank inside a container (run --image): its record, with the pid it has on this
    host (the record holds the engine client's, or the pid inside the container)."""
    from .inimage import rank_host_pid

    local = record["local_rank"]
    path = os.path.join(run_dir, "stacks.%d" % local)
    inner = _hook_pid(_head(run_dir, local))
    pid = rank_host_pid(run_id, path, inner)
    return dict(record, pid=pid, hook_pid=inner)


def _by_hook(run_dir, record, wait):
    pid = record["pid"]
    path = os.path.join(run_dir, "stacks.%d" % record["local_rank"])
    head = _head(run_dir, record["local_rank"])
    hook = record["hook_pid"] if "hook_pid" in record else pid
    if hook is None or (MARKER % hook) not in head:
        return None, "no stack hook in this rank (not Python, or started with -I or -S); install py-spy on the host"
    offset = os.path.getsize(path)
    os.kill(pid, STACK_SIGNAL)
    text = _settled(path, offset, wait)
    return (text, None) if text.strip() else (None, "the rank did not answer in %gs" % wait)


def _by_py_spy(py_spy, pid, wait):
    try:
        done = subprocess.run([py_spy, "dump", "--pid", str(pid)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=wait + 5)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, "py-spy: %s" % err
    text = done.stdout[:MAX_BYTES].decode("utf-8", "replace")
    return (text, None) if done.returncode == 0 else (None, "py-spy: " + text.strip()[-300:])


@op("stacks.dump")
def dump(request):
    run_dir = _run_dir(request)
    wait = float(request.get("wait") or 3.0)
    py_spy = None if request.get("no_py_spy") else shutil.which("py-spy")
    found = []
    node = run_files.read_json(os.path.join(run_dir, "node.json"), {}) or {}
    for record in run_files.rank_records(run_dir):
        if node.get("container") and record.get("ended") is None:
            record = in_container(run_dir, request["run_id"], record)
        pid = record.get("pid")
        entry = {"local_rank": record.get("local_rank"), "rank": record.get("rank"),
                 "pid": pid, "method": None, "stack": None, "error": None}
        if not pid or record.get("ended") is not None or not processes.is_alive(pid):
            entry["error"] = "not running"
        elif py_spy:
            entry["method"] = "py-spy"
            entry["stack"], entry["error"] = _by_py_spy(py_spy, pid, wait)
        else:
            entry["method"] = "faulthandler"
            entry["stack"], entry["error"] = _by_hook(run_dir, record, wait)
        found.append(entry)
    return {"ranks": found, "time": time.time()}
