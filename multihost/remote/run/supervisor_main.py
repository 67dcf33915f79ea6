"""The supervisor's process: the body of the detached process that supervises one node
of a run (supervisor.py's Supervisor). Stdlib only, Python 3.6+.

It is started by the ``run.launch`` operation with a double fork and setsid, so it
belongs to no ssh session: a controller that disconnects or dies does not end the job.
It declares itself a child subreaper, so a grandchild whose parent dies (a data-loader
worker of a killed rank) is re-parented to it and is still found and stopped.

Signals: SIGTERM asks for a stop with the grace period written in stop.json; SIGUSR1
asks to kill at once. It never dies before writing the final state: every path out of
``supervise`` goes through ``finish``.
"""
import ctypes
import errno
import os
import signal
import sys
import time
import traceback

from ..registry import holds
from . import files as run_files
from . import processes
from ..sync import lock as sync_lock
from .container import ContainerError
from .supervisor import Supervisor

PR_SET_CHILD_SUBREAPER = 36


def set_subreaper():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans go to init, and are still found by their env marker


def supervise(spec, run_dir, ready_fd):
    """Body of the detached grandchild; returns the process exit status."""
    sup = Supervisor(spec, run_dir, ready_fd)
    set_subreaper()
    signal.signal(signal.SIGTERM, sup.on_stop)
    signal.signal(signal.SIGUSR1, sup.on_stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    me = {"pid": os.getpid(), "ticks": processes.start_ticks(os.getpid())}
    try:
        run_files.make_reserve(run_dir)
        sup.record(supervisor=me)
        run_files.set_lock_supervisor(sup.run_id, me)
        holds.supervised(sup.run_id, me["pid"], me["ticks"])   # the host-wide registry
        try:
            # Held for the run's life: a sync into this workdir is refused naming the run.
            sup.workdir_claim = sync_lock.hold_for_run(
                os.path.join(os.path.expanduser("~"), os.path.expanduser(spec.get("cwd") or "~")),
                sup.run_id, in_place=bool(spec.get("in_place")))
        except sync_lock.Busy as busy:
            sup.finish(error=busy.text)
            sup.tell_launch_op({"ok": False, "error": busy.text, "fix": busy.fix})
            return 1
        try:
            sup.start()
        except OSError as err:
            what = err.filename or spec["argv"][0]
            message = "cannot start %s: %s" % (what, err.strerror or err)
            sup.finish(error=message)
            sup.tell_launch_op({"ok": False, "error": message})  # no log: the message is all
            return 1
        except ContainerError as err:
            sup.finish(error=err.text)
            sup.tell_launch_op({"ok": False, "error": err.text, "fix": err.fix})
            return 1
        first = min(sup.children) if sup.children else None
        sup.record(state="running", started=time.time(), pid=first, pgid=sup.pgid,
                   pids=sorted(sup.children))
        sup.tell_launch_op({"ok": True, "node": sup.node})
        sup.loop()
        sup.finish()
        return 0
    except BaseException as exc:  # never leave without a final state
        text = traceback.format_exc()
        error = "supervisor crashed: %s" % text.strip().splitlines()[-1]
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            error = run_files.NO_SPACE
        try:
            sys.stderr.write(text)  # supervisor.log (see ops_run.start_supervisor)
            sys.stderr.flush()
        except OSError:
            pass
        try:
            processes.terminate(sup.run_id, os.getpid(), 0, skip_groups=(os.getpgrp(),))
            sup.finish(error=error)
        finally:
            sup.tell_launch_op({"ok": False, "error": error,
                                "log": os.path.join(run_dir, "supervisor.log")})
        return 1
