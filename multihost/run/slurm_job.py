"""The monitor's questions to Slurm about the job a run's nodes are steps of.

Apart from monitor.py as status_streams.py is: this is the talking (a thread per kept
launch step, one for a question to Slurm), and what it hears goes on the monitor's queue
as ``(kind, rank, payload, time)``: ``("step", rank, None, t)`` when a node's kept launch
step (slurm/steps.py) ends, ``("slurm", rank, JobEnd or None, t)`` when Slurm answered
whether the job ended (slurm/ending.py). The monitor decides what follows.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Dict, Optional

ASK_EVERY = 2.0   # seconds between two questions to Slurm about the job


class SlurmJobWatch:
    """``job_id``: '' when the nodes are not srun steps (then nothing is ever asked)."""

    def __init__(self, job_id: str, steps: Dict[int, object], answers: "queue.Queue[tuple]",
                 stop_polling: threading.Event):
        self.job_id = job_id
        self.steps = dict(steps)
        self.answers = answers
        self.stop_polling = stop_polling
        self.asking = False                    # a question is out: its answer will come
        self.asked_at: Optional[float] = None

    @classmethod
    def of(cls, cluster, steps, answers, stop_polling) -> "SlurmJobWatch":
        """The job of ``cluster``'s nodes when they are reached by srun (SrunOptions)."""
        job = str(getattr(getattr(cluster, "options", None), "job_id", "") or "")
        return cls(job, steps or {}, answers, stop_polling)

    def watch_steps(self) -> None:
        """A thread per kept launch step: its end is put on the queue."""
        def wait(rank: int, step) -> None:
            try:
                step.wait()
            except Exception:   # a step that cannot be waited on is over for us
                pass
            if not self.stop_polling.is_set():
                self.answers.put(("step", rank, None, time.time()))

        for rank, step in self.steps.items():
            threading.Thread(target=wait, args=(rank, step), name=f"step-{rank}",
                             daemon=True).start()

    def ask(self, rank: int, when: float) -> None:
        """Ask Slurm once whether the job ended (on a thread: scontrol may be slow); at
        most one question out, and none within ASK_EVERY of the last."""
        if not self.job_id or self.asking or (
                self.asked_at is not None and when - self.asked_at < ASK_EVERY):
            return
        from ..slurm.ending import job_end

        self.asking, self.asked_at = True, when

        def ask() -> None:
            try:
                answer = job_end(self.job_id)
            except Exception:   # no answer: the run goes on as without Slurm
                answer = None
            self.answers.put(("slurm", rank, answer, when))

        threading.Thread(target=ask, name="slurm-job", daemon=True).start()

    def answered(self) -> None:
        self.asking = False
