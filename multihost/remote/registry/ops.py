"""The host registry's operations (see holds.py): a run's claim at prepare, its
supervisor's pid, its end; a queued run's place; the list that ``status --all`` and the
queue read. Stdlib only, Python 3.6+.
"""
import os
import time

from . import holds
from ..run import files as run_files
from ..proto import OpError, op


def busy_error(entry, mine):
    """The one line a refused run shows, with the fix that fits who holds the host."""
    line = "busy: " + holds.holder_line(entry)
    if entry["uid"] == mine["uid"]:
        fix = ("wait for it: add `--queue`, or, if it is yours, stop it: run `multihost stop "
               "%s` on its controller%s" % (entry["name"] or entry["run_id"],
                                            " (%s)" % entry["controller"] if entry["controller"] else ""))
    else:
        fix = ("wait for it: add `--queue`, or leave this host out (`--exclude`), or ask %s"
               % entry["user"])
    return OpError(line, fix)


def conflicts(entries, run_id, gpus, ports):
    mine = os.getuid()
    return [e for e in entries if e["kind"] == "run" and e["live"]
            and (e["run_id"], e["uid"]) != (run_id, mine)
            and holds.overlaps(e["gpus"], gpus, e["ports"], ports)]


def _write(kind, run_id, data, base):
    """Into the registry, else this user's own fallback; never the reason a run fails
    (the registry is advisory: a run's own lock keeps this user's runs apart)."""
    for where in (base, holds.personal_dir()):
        try:
            if where != base:
                os.makedirs(where, mode=0o700, exist_ok=True)
            holds.write(kind, run_id, data, where)
            return
        except OSError:
            continue


def claim(request):
    """At prepare: refuse when a live run of anyone holds what this run needs here (unless
    --allow-concurrent), else record this run as holding the host."""
    run_id = request["run_id"]
    hold = request.get("hold") or {}
    gpus, ports = hold.get("gpus"), hold.get("ports") or []
    try:
        with holds.locked() as base:
            entries = holds.read_all()
            holds.prune(entries)
            found = conflicts(entries, run_id, gpus, ports)
            if found and not request.get("allow_concurrent"):
                raise busy_error(found[0], holds.me())
            _write("run", run_id, {
                "name": hold.get("name") or "", "controller": hold.get("controller") or "",
                "gpus": gpus, "ports": ports, "hosts": hold.get("hosts") or [],
                "time": time.time(), "state": "prepared",
                "stale_after": float(request.get("stale_after") or 120)}, base)
    except OSError:
        pass   # no registry to read or write here: it is advisory, the run goes on


@op("hold.list")
def hold_list(request):
    entries, trouble = holds.scan()
    return {"me": holds.me(), "entries": entries, "now": time.time(), "trouble": trouble}


@op("hold.queue")
def hold_queue(request):
    """Add or refresh this run's queue entry; with ``leave``, take it out. The answer is
    every entry, for the controller to find its place."""
    run_id = request["run_id"]
    if not run_files.valid_run_id(run_id):
        raise OpError("bad run id %r" % (run_id,))
    try:
        with holds.locked() as base:
            entries = holds.read_all()
            holds.prune(entries)
            if request.get("leave"):
                holds.remove("queue", run_id)
            else:
                own = holds.read_own("queue", run_id)
                q = request.get("queue") or {}
                _write("queue", run_id, {
                    "name": q.get("name") or "", "controller": q.get("controller") or "",
                    "gpus": q.get("gpus"), "ports": q.get("ports") or [],
                    "hosts": q.get("hosts") or [],
                    "time": own["time"] if own else float(q.get("asked") or time.time()),
                    "seen": time.time()}, own["dir"] if own else base)
    except OSError:
        pass   # advisory: the queue then goes by what could be read
    return {"me": holds.me(), "entries": holds.read_all(), "now": time.time()}
