"""The GPU sampler of one node of a run: ``nvidia-smi`` every few seconds while the
run's ranks run, appended to the run directory's ``gpu.log``. Stdlib only, Python 3.6+.

It lives inside the supervisor's loop, with no thread and no process of its own, so
nothing of it can outlive the supervisor: each turn it starts one nvidia-smi when a
sample is due (never two at once), and reads its output once the supervisor has reaped
it. nvidia-smi runs with its output in a file, not a pipe, so a full pipe can never
block the supervisor; one that hangs (a wedged driver) is killed after TIMEOUT.

A host without nvidia-smi on the job's PATH has no sampler and no gpu.log; one whose
nvidia-smi keeps failing (no driver) stops being asked after FAILURES tries.

gpu.log: a header line, then one line per GPU of the run and sample:
``<epoch time>, <the fields of QUERY as nvidia-smi printed them>``. The run's GPUs are
those of CUDA_VISIBLE_DEVICES (indices or UUIDs) when the job has it, else every GPU.
"""
import os
import shutil
import signal
import subprocess
import time

from . import files as run_files

QUERY = "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
HEADER = "# time, %s (nvidia-smi --format=csv,noheader,nounits)\n" % QUERY
LOG = "gpu.log"
TIMEOUT = 10.0
FAILURES = 3            # tries in a row with no row: this host has no working GPU
MAX_OUTPUT = 64 * 1024  # bytes of one nvidia-smi answer read (8 GPUs take under 1 KiB)
MAX_ROW = 512


def visible(value):
    """CUDA_VISIBLE_DEVICES as a set of indices or UUIDs; None: every GPU is the run's."""
    if not value or not value.strip():
        return None
    return set(part.strip() for part in value.split(",") if part.strip())


class GpuSampler(object):
    def __init__(self, run_dir, env, interval):
        self.path = os.path.join(run_dir, LOG)
        self.out_path = os.path.join(run_dir, ".gpu.sample")
        self.interval = float(interval or 0)
        self.wanted = visible(env.get("CUDA_VISIBLE_DEVICES"))
        self.command = None
        if self.interval > 0:
            smi = shutil.which("nvidia-smi", path=env.get("PATH") or os.defpath)
            if smi:
                self.command = [smi, "--query-gpu=" + QUERY, "--format=csv,noheader,nounits"]
        self.env = {"PATH": env.get("PATH") or os.defpath, "LC_ALL": "C"}
        self.proc = None         # the nvidia-smi in flight
        self.started = 0.0
        self.due = time.time() + self.interval  # the first sample once the ranks are up
        self.failures = 0

    def owns(self, pid):
        return self.proc is not None and self.proc.pid == pid

    def tick(self, now):
        """One turn of the supervisor's loop: kill a sample gone on too long, or start one."""
        if self.command is None:
            return
        if self.proc is not None:
            if now - self.started > TIMEOUT:
                self._kill()
            return
        if now < self.due:
            return
        self.due = now + self.interval
        out = run_files.open_private(self.out_path)
        try:
            out.truncate(0)
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.DEVNULL, env=self.env,
                                         close_fds=True, cwd="/")
            self.started = now
        except OSError:
            self.command = None  # gone since we looked: no sampler
        finally:
            out.close()

    def exited(self, status):
        """The supervisor reaped our nvidia-smi: keep what it printed."""
        proc, self.proc = self.proc, None
        proc.returncode = status  # told: a Popen that polls a reaped pid could steal a rank's
        rows = self._rows() if status == 0 else []
        if not rows:
            self.failures += 1
            if self.failures >= FAILURES:
                self.command = None
            return
        self.failures = 0
        stamp = "%.3f, " % time.time()
        fresh = not os.path.exists(self.path)
        with run_files.open_private(self.path) as log:
            text = (HEADER if fresh else "") + "".join(stamp + row + "\n" for row in rows)
            log.write(text.encode("utf-8", "replace"))

    def _rows(self):
        try:
            with open(self.out_path, "rb") as handle:
                data = handle.read(MAX_OUTPUT)
        except OSError:
            return []
        rows = []
        for line in data.decode("utf-8", "replace").splitlines():
            line = line.strip()
            fields = [f.strip() for f in line.split(",")]
            if not line or len(line) > MAX_ROW or len(fields) != 7:
                continue
            if self.wanted is None or fields[0] in self.wanted or fields[1] in self.wanted:
                rows.append(line)
        return rows

    def _kill(self):
        try:
            os.kill(self.proc.pid, signal.SIGKILL)  # not reaped yet: still our child
        except OSError:
            pass

    def stop(self):
        """Before the supervisor's last look for the run's processes, and at its end:
        no nvidia-smi is left behind, and no more is started."""
        self.command = None
        if self.proc is not None:
            self._kill()
            try:
                _, status = os.waitpid(self.proc.pid, 0)
            except ChildProcessError:
                status = 0
            self.proc.returncode = status
            self.proc = None
        try:
            os.unlink(self.out_path)
        except OSError:
            pass
