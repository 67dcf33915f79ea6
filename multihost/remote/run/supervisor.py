"""The supervisor of one node of a run: on the host, it starts the launcher (or one
process per rank), waits for it, tears down whatever it leaves behind, and records every
change in node.json; a stop asked (stop.json, a signal) or a rank's failure ends the
node. Its process, detached from every ssh session, is supervisor_main.py's. Stdlib
only, Python 3.6+.
"""
import errno
import json
import os
import signal
import subprocess
import time

from ..registry import holds
from . import files as run_files
from . import processes
from .blocked import BlockedRanks
from . import ps as run_ps
from .gpus import GpuSampler
from .rankwrap import child_env, exit_mark

PR_SET_CHILD_SUBREAPER = 36
POLL = 0.05


class Supervisor(object):
    """One node: ``spec`` is the launch request (argv, env, cwd, spawn, nproc, ...)."""

    def __init__(self, spec, run_dir, ready_fd):
        self.spec = spec
        self.run_dir = run_dir
        self.ready_fd = ready_fd
        self.run_id = spec["run_id"]
        self.node_path = os.path.join(run_dir, "node.json")
        self.node = run_files.read_json(self.node_path, {}) or {}
        self.children = {}      # pid -> local rank (rank mode) or None (the launcher)
        # The Popen objects stay referenced: a dropped Popen polls (waitpid) its child when
        # it is collected, and would reap a fast rank before `reap` sees its exit status.
        self.procs = []
        self.pgid = None        # known when started: a process may be gone when we look
        self.exits = {}         # pid -> (exit_code, signal, time)
        self.stop_asked = None  # time a stop was asked (from outside, or a local failure)
        self.stopped_from_outside = None  # time of the SIGTERM/SIGUSR1 from `stop`
        self.kill_now = False
        self.teardown_deadline = None
        self.termed = set()
        self.gpus = None        # the GPU sampler (gpus.py), made in start()
        self.image = None       # inimage.ImageRun under `run --image`, made in start()
        # Until the controller says every node launched (run.launched): a controller lost
        # between two launches leaves the others' rendezvous waiting for us forever.
        self.launch_deadline = run_files.launch_deadline(self.node)

    # --- records --------------------------------------------------------------------
    def record(self, **changes):
        self.node.update(changes)
        try:
            run_files.write_json(self.node_path, self.node)
        except OSError as err:
            if err.errno != errno.ENOSPC or "ended" not in changes:
                raise
            # The node's last record, with its ranks stopped: the room kept is for it.
            run_files.free_reserve(self.run_dir)
            run_files.write_json(self.node_path, self.node)

    def tell_launch_op(self, reply):
        if self.ready_fd is not None:
            try:
                os.write(self.ready_fd, (json.dumps(reply) + "\n").encode())
            finally:
                os.close(self.ready_fd)
                self.ready_fd = None

    # --- signals --------------------------------------------------------------------
    def on_stop(self, signum, frame):
        now = time.time()
        if self.stopped_from_outside is None:
            self.stopped_from_outside = now
        if self.stop_asked is None:
            self.stop_asked = now
        if signum == signal.SIGUSR1:
            self.kill_now = True

    # --- start ----------------------------------------------------------------------
    def start(self):
        spec = self.spec
        if spec.get("container"):
            from .inimage import ImageRun

            self.image = ImageRun(spec, self.run_dir, self.node.get("attempt") or 0)
            self.record(container=self.image.record())
            env = self.image.job_env(spec)
        else:
            env = dict(os.environ)
            env.update(spec["env"])
            run_files.python_first_on_path(env, spec.get("python"))
        cwd = spec["cwd"]
        env["PWD"] = cwd  # what a shell would say after `cd`: scripts read it
        self.gpus = GpuSampler(self.run_dir, dict(os.environ, **spec["env"]),
                               spec.get("gpu_interval"))
        if spec.get("spawn") == "rank":
            self.start_ranks(spec["argv"], env, cwd)
        elif spec.get("spawn") == "ps":
            run_ps.start_roles(self, spec["argv"], env, cwd)
        else:
            out = run_files.open_private(os.path.join(self.run_dir, "launcher.log"))
            argv = spec["argv"]
            if self.image is not None:
                argv, env = self.image.command(argv, env)
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
            out.close()
            self.procs.append(proc)
            self.children[proc.pid] = None
            self.pgid = proc.pid  # a new session leads its own group

    def start_ranks(self, argv, env, cwd):
        """The python template: one process per local rank, torch-style variables set
        here, all in one new process group, each writing its own workerlog."""
        spec = self.spec
        nproc = int(spec["nproc"])
        offset = int(spec["rank_offset"])
        group = []

        def join_group():
            # One new process group for all ranks (setpgid, not setsid: a process can
            # only join a group of its own session).
            os.setpgid(0, group[0] if group else 0)

        for local in range(nproc):
            rank_env = dict(env)
            rank_env.update({
                "LOCAL_RANK": str(local), "RANK": str(offset + local),
                "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(spec["world_size"]),
                "GROUP_RANK": str(spec["node_rank"]), "GROUP_WORLD_SIZE": str(spec["nnodes"]),
                "MASTER_ADDR": spec["master_addr"], "MASTER_PORT": str(spec["master_port"]),
            })
            child_env(rank_env, self.run_dir, str(local))  # as the rank wrapper does
            log = run_files.open_private(os.path.join(self.run_dir, "log", "workerlog.%d" % local))
            rank_argv = argv
            if self.image is not None:   # a container per rank, each the rank's own
                rank_argv, rank_env = self.image.command(argv, rank_env, local)
            # Rank 0 leads the group even once it has exited: it stays a zombie (and its
            # group stays joinable) until `reap` collects it, after every rank started.
            proc = subprocess.Popen(rank_argv, cwd=cwd, env=rank_env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, close_fds=True,
                                    preexec_fn=join_group)
            log.close()
            self.procs.append(proc)
            group.append(proc.pid)
            self.pgid = group[0]
            self.children[proc.pid] = local
            run_files.write_json(os.path.join(self.run_dir, "rank.%d.json" % local), {
                "local_rank": local, "rank": offset + local, "pid": proc.pid,
                "started": time.time(), "ended": None, "exit_code": None, "signal": None})

    # --- the loop -------------------------------------------------------------------
    def reap(self):
        """Collect every exited child, ours or adopted (we are a subreaper)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.gpus is not None and self.gpus.owns(pid):
                self.gpus.exited(status)
                continue
            if pid in self.children and pid not in self.exits:
                if os.WIFSIGNALED(status):
                    code, sig = None, os.WTERMSIG(status)
                else:
                    code, sig = os.WEXITSTATUS(status), None
                if self.image is not None:
                    code, sig = self.image.exit_of(code, sig)
                self.exits[pid] = (code, sig, time.time())
                local = self.children[pid]
                if local is not None:
                    self.record_rank_exit(local, pid)

    def record_rank_exit(self, local, pid):
        path = os.path.join(self.run_dir, "rank.%d.json" % local)
        rec = run_files.read_json(path, {}) or {}
        code, sig, when = self.exits[pid]
        rec.update({"ended": when, "exit_code": code, "signal": sig,
                    "exiting": exit_mark(self.run_dir, local)})
        if (code or sig) and run_files.no_space(self.run_dir):
            # It died writing its log into a full disk: the disk is the cause, said once
            # for the node, not this rank's exit (its traceback could not be written).
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        run_files.write_json(path, rec)
        if (code or sig) and self.stop_asked is None:
            # Like torchrun: one failed rank ends its local peers.
            self.stop_asked = time.time()
            self.node["stop_reason"] = "local rank %d failed" % local

    def give_up_launch(self):
        """The launch deadline passed: go on if every node launched, else stop the job
        and say why. The reason is recorded before the word is looked for again, so a
        ``run.launched`` landing at this very moment either sees the reason (and tells
        the controller the launch failed) or is seen here (and the job goes on)."""
        launched = os.path.join(self.run_dir, run_files.LAUNCHED)
        self.launch_deadline = None
        if os.path.exists(launched) or self.stop_asked is not None:
            return
        self.record(stop_reason=run_files.LAUNCH_LOST)
        if os.path.exists(launched):
            self.node.pop("stop_reason", None)
            self.record()
            return
        self.stop_asked = self.stopped_from_outside = time.time()

    def running(self):
        return [pid for pid in self.children if pid not in self.exits]

    def loop(self):
        grace = float(self.spec.get("grace", 10))
        tightened = 0.0
        while True:
            self.reap()
            if time.time() - tightened >= 1.0:  # a launcher's own logs, as they appear
                run_files.make_run_files_private(self.run_dir)
                tightened = time.time()
            if self.gpus is not None and self.stop_asked is None:
                self.gpus.tick(time.time())
            if self.spec.get("spawn") == "ps":
                run_ps.check(self)
            if self.launch_deadline is not None and time.time() >= self.launch_deadline:
                self.give_up_launch()
            if self.stop_asked is not None and self.teardown_deadline is None:
                stop = run_files.read_json(os.path.join(self.run_dir, "stop.json"), {}) or {}
                if "grace" in stop:
                    grace = float(stop["grace"])
                if stop.get("reason"):
                    self.node["stop_reason"] = stop["reason"]
                if self.stopped_from_outside is not None:
                    # Said before a rank is signalled: a controller that follows the run
                    # reads the deaths that follow as the stop's, not as failures.
                    self.record(stopping=self.stopped_from_outside)
                self.teardown(grace)
            if not self.running():
                self.stop_gpus()  # not an orphan: ours, and done with
                # The launcher is done; anything it left behind is an orphan of the run.
                if processes.run_processes(self.run_id, os.getpid()):
                    self.teardown(grace if self.stop_asked else min(grace, 3.0))
                    self.reap()
                return
            time.sleep(POLL)

    def stop_gpus(self):
        if self.gpus is not None:
            self.gpus.stop()

    def teardown(self, grace):
        self.stop_gpus()
        started = time.time()
        self.teardown_deadline = started + grace
        blocked = BlockedRanks()
        said = {"at": started, "text": ""}

        def kill_now():
            self.say_stop_wait(blocked, said, started + grace)
            return self.kill_now or self.poll_exits_and_stop()
        processes.terminate(self.run_id, os.getpid(), grace, kill_now=kill_now,
                            skip_groups=(os.getpgrp(),), blocked=blocked)
        if blocked.ranks:
            self.record(stop_wait="", stop_note="%d rank%s blocked in a collective that %s peers left: "
                                  "killed after %.1f s of the %g s kill wait" % (
                                      blocked.ranks, "" if blocked.ranks == 1 else "s",
                                      "its" if blocked.ranks == 1 else "their",
                                      time.time() - started, grace))
        self.remove_containers()

    def say_stop_wait(self, blocked, said, kill_at):
        """Once a second during the kill wait: what it waits for, in node.json's
        ``stop_wait``, which the controller shows as a note of the host."""
        now = time.time()
        if now - said["at"] < 1.0:
            return
        said["at"] = now
        text = blocked.summary(kill_at - now)
        if text.partition("; SIGKILL in")[0] != said["text"].partition("; SIGKILL in")[0]:
            said["text"] = text
            self.record(stop_wait=text)

    def remove_containers(self):
        """The run's containers on this host, killed and removed by their label: what
        the stop by marker missed (an engine that hangs, a container still starting)."""
        if self.image is not None:
            self.image.remove()

    def poll_exits_and_stop(self):
        """During a grace period: keep reaping, and see a second (kill-now) request."""
        self.reap()
        return self.kill_now

    # --- the end --------------------------------------------------------------------
    def outcome(self):
        """(state, exit_code, signal). A node that failed before it was asked to stop
        failed; one stopped before any failure was stopped; else its exits decide."""
        if self.spec.get("spawn") == "ps":
            return run_ps.outcome(self)
        exits = [self.exits[pid] for pid in self.children if pid in self.exits]
        failed = sorted((e for e in exits if e[0] or e[1]), key=lambda e: e[2])
        code, sig = (failed[0][0], failed[0][1]) if failed else (0, None)
        failure_times = [e[2] for e in failed]
        for rank in run_files.rank_records(self.run_dir):
            if rank.get("exit_code") or rank.get("signal"):
                failure_times.append(rank.get("ended") or time.time())
        first_failure = min(failure_times) if failure_times else None
        outside = self.stopped_from_outside
        if outside is not None and (first_failure is None or first_failure >= outside):
            return "stopped", code, sig
        if first_failure is not None or len(exits) < len(self.children):
            return "failed", code, sig
        return "succeeded", code, sig

    def finish(self, error=None):
        self.stop_gpus()
        self.remove_containers()
        run_files.make_run_files_private(self.run_dir)
        state, code, sig = ("failed", None, None) if error else self.outcome()
        self.record(state=state, exit_code=code, signal=sig, ended=time.time(),
                    error=error, ranks_left=len(processes.run_processes(self.run_id, os.getpid())))
        run_files.release_lock(self.run_id)  # only its own: a concurrent run holds none
        claim = getattr(self, "workdir_claim", None)
        if claim is not None:   # its name in a shared workdir's lock goes, not only its locks
            claim.give_back()
        holds.ended(self.run_id)             # the host-wide registry, which every user reads
