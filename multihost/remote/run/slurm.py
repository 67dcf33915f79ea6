"""Operations of a run whose nodes are steps of a Slurm allocation (stdlib, python3.6+).

slurm.launch  ``run.launch``, except that the supervisor stays a child of this process
              and the operation lasts as long as it. The controller starts it with
              ``srun --overlap`` and keeps that srun: the step is the node's part of the
              job, so Slurm tracks the launcher and the ranks, `scancel` or the end of the
              allocation stops them, and the step ends with the supervisor's status. A
              supervisor detached as over ssh would escape the step: with
              proctrack/cgroup Slurm kills it as soon as the launch step ends, with
              proctrack/linuxproc it loses track of it.

The reply is the first line on stdout, as from any operation; then stdout is closed and
nothing else is written (the controller reads no further).
"""
import os
import signal

from . import ops as ops_run
from ..proto import EXIT_HELPER_FAILED, OpError, op, reply


def _exit_status(status):
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


@op("slurm.launch", stream=True)
def launch(request):
    kept = []

    def forward(signum, frame):
        # Slurm signals every process of the step (scancel, the time limit); the
        # supervisor handles SIGTERM as a stop. Staying alive keeps it in the step.
        for pid in kept:
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(signum, forward)
    # run.launch's own checks and records, with the supervisor our child, not detached
    try:
        node = ops_run.launch(request, kept=kept)
    except OpError as err:
        reply({"ok": False, "error": err.error, "fix": err.fix})
        node = None
    else:
        reply({"ok": True, "result": node})
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    if not kept:
        return EXIT_HELPER_FAILED
    while True:
        try:
            _, status = os.waitpid(kept[0], 0)
            break
        except InterruptedError:
            continue
    return _exit_status(status) if node is not None else EXIT_HELPER_FAILED
