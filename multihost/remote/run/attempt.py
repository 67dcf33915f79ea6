"""A run launched again under the same run id (``--max-restarts``): before attempt k is
prepared on a host, what the earlier attempt left in the run directory (its node record,
rank records, logs, launcher and supervisor output) moves into ``attempt_<j>/`` beside
it. Every attempt keeps its own files, and the status, watch, logs and stop operations
go on reading the run directory itself, which is always the current attempt.
"""
import os

from . import files as run_files
from . import processes
from ..proto import OpError

KEPT = ("rankwrap.py", "stackhook")   # written again by every prepare: nothing of the attempt's own


def archive_attempt(run_dir, attempt):
    """Move the files of the attempt before ``attempt`` into ``attempt_<j>``. A host that
    never ran this run (a spare taking a rank) has nothing to move."""
    node = run_files.read_json(os.path.join(run_dir, "node.json"))
    if node is None:
        return
    previous = int(node.get("attempt") or 0)
    if previous >= attempt:
        # This attempt was prepared here already: a second entry of the same machine.
        return
    if node.get("supervisor") and processes.supervisor_alive(node):
        raise OpError("attempt %d of run %s still runs on this host" % (previous, node.get("run_id")),
                      "stop it first: multihost stop %s" % node.get("run_id"))
    target = os.path.join(run_dir, "attempt_%d" % previous)
    run_files.private_dirs(target)
    for name in os.listdir(run_dir):
        if name in KEPT or name.startswith("attempt_"):
            continue
        os.replace(os.path.join(run_dir, name), os.path.join(target, name))
