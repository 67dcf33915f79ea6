"""A node's run as the run operations (ops.py) read and end it: its status (node.json,
read again after its ranks', whether its supervisor lives, the tails of failed ranks), the
word that every node launched or the node's expiry without it, and a stop: asked of the
supervisor when it lives (grace, then SIGKILL), else done here. Stdlib only, Python 3.6+.
"""
import json
import os
import time

from ..registry import holds
from . import files as run_files
from . import processes
from ..proto import OpError


def say_launched(run_dir):
    """The word the supervisor waits for until its launch deadline (supervisor.py)."""
    run_files.write_json(os.path.join(run_dir, run_files.LAUNCHED), {"time": time.time()})


def expire_unlaunched(run_dir, node):
    """A node prepared but never launched, past its launch deadline: stopped, for good."""
    node.update(state="stopped", ended=time.time(), stop_reason=run_files.LAUNCH_LOST)
    run_files.write_json(os.path.join(run_dir, "node.json"), node)
    run_files.release_lock(node.get("run_id"))
    holds.ended(node.get("run_id"))


def node_status(run_dir, node, tail, count_procs=True, tail_rank=None):
    """What ``run.status`` and ``run.watch`` say of the node: its record, its state (a
    running node whose supervisor died is failed), every rank's, and with ``tail`` the
    last lines of the failed ranks' logs (and ``tail_rank``'s) and of the launcher's."""
    if node.get("state") == "prepared" and not node.get("supervisor") \
            and run_files.launch_expired(run_dir, node):
        expire_unlaunched(run_dir, node)
    ranks = run_files.rank_records(run_dir)
    # The node's record read again, after its ranks': the supervisor records a stop
    # before it signals a rank, so a rank the stop ended is never sent without the stop
    # (the controller would blame it). A loaded host can take long between the reads.
    again = run_files.read_json(os.path.join(run_dir, "node.json"))
    node = again if isinstance(again, dict) else node
    alive = processes.supervisor_alive(node)
    state = node.get("state")
    detail = node.get("error") or (node.get("stop_reason") if state == "stopped" else "") or ""
    if state == "running" and not alive:
        state, detail = "failed", "its supervisor died (host rebooted, or killed?)"
        if run_files.no_space(run_dir):
            detail = run_files.NO_SPACE
    result = {"node": node, "state": state, "detail": detail, "supervisor_alive": alive,
              "ranks": ranks, "time": time.time(),
              "procs": len(processes.run_processes(node.get("run_id") or "",
                                                   (node.get("supervisor") or {}).get("pid")
                                                   if alive else None)) if count_procs else None}
    if tail:
        wanted = {r["local_rank"] for r in ranks if r.get("exit_code") or r.get("signal")}
        if tail_rank is not None:
            wanted.add(int(tail_rank))
        result["tails"] = {str(local): run_files.tail_lines(
            os.path.join(run_dir, "log", "workerlog.%d" % local), tail) for local in sorted(wanted)}
        result["launcher_tail"] = run_files.tail_lines(os.path.join(run_dir, "launcher.log"), tail)
    return result


def node_or_fail(run_dir, run_id):
    """The node's record, or an OpError when the run has none on this host."""
    node = run_files.read_json(os.path.join(run_dir, "node.json"))
    if not isinstance(node, dict):
        raise OpError("no run %s on this host" % run_id,
                      "list runs with `multihost status --list`")
    return node


class StopLines:
    """Stop requests arriving on stdin, one JSON line each, read without blocking the
    watch (called after select says stdin is readable, or not). EOF (the controller
    closed its side, or went away) ends the reading, not the watch."""

    def __init__(self):
        self.closed = False
        self.buffer = b""

    def read(self):
        import select

        if self.closed or not select.select([0], [], [], 0)[0]:
            return []
        data = os.read(0, 65536)
        if not data:
            self.closed = True
            return []
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        self.buffer = self.buffer[-65536:]   # a line with no end is not kept forever
        stops = []
        for line in lines:
            try:
                stop = json.loads(line.decode("utf-8", "replace")).get("stop")
                stops.append((float(stop.get("grace", 10)), str(stop.get("reason") or "stopped")))
            except (ValueError, AttributeError, TypeError):
                continue  # not a stop request: nothing else is asked on this stream
        return stops


def ask_stop(run_id, run_dir, node, grace, reason):
    """Ask the run's supervisor to stop it (grace, then SIGKILL); True if there is one to
    ask. A prepared node that never launched is marked stopped here and then."""
    import signal

    if node.get("state") == "prepared" and not node.get("supervisor"):
        node.update(state="stopped", ended=time.time(), stop_reason=reason)
        run_files.write_json(os.path.join(run_dir, "node.json"), node)
        run_files.release_lock(run_id)
        holds.ended(run_id)
        return False
    if node.get("state") in run_files.FINAL_STATES or not processes.supervisor_alive(node):
        return False
    stop_path = os.path.join(run_dir, "stop.json")
    asked = run_files.read_json(stop_path, {}) or {}
    if "grace" not in asked or grace < float(asked["grace"]):
        run_files.write_json(stop_path, {"grace": grace, "reason": reason, "time": time.time()})
    try:
        os.kill(node["supervisor"]["pid"], signal.SIGUSR1 if grace <= 0 else signal.SIGTERM)
    except OSError:
        pass
    return True


def end_stop(run_id, run_dir, node, grace, reason, reply=False):
    """No supervisor (it died, or never ran), or it did not finish in time: stop what is
    left here and record the node stopped. The node's record, or with ``reply`` the
    answer of ``run.stop``."""
    node_path = os.path.join(run_dir, "node.json")
    hard = 0
    if processes.run_processes(run_id):
        hard = processes.terminate(run_id, None, grace)
    node = run_files.read_json(node_path, node) or node
    if node.get("container"):   # its containers too, by their label
        from .inimage import remove_for

        remove_for(node["container"], run_id)
    if node.get("state") not in run_files.FINAL_STATES:
        node.update(state="stopped", ended=time.time(), stop_reason=reason)
        run_files.write_json(node_path, node)
        run_files.release_lock(run_id)
        holds.ended(run_id)
    if not reply:
        return node
    result = node_status(run_dir, node, 0)
    result["killed_hard"] = hard
    return result
