"""Real programs on 3 lab hosts x 2 ranks (the issue's shape): a PyTorch Lightning DDP
job with its default bar (rich, where rich is installed) and with its TQDM bar, and the
Hugging Face Trainer. For each: when the first live step reaches ``--json`` (a
``metrics`` record of a bar still being drawn), how many steps were seen live, and how
long a Ctrl-C takes to end the run on every host (SIGINT to ``multihost run``, to its
exit), against the kill wait (10 s by default).
Run as root: python bench/programs.py [--runs 1]
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _lab import REPO, hostfile, main_with_lab

PROGRAMS = REPO / "tests" / "lab" / "programs"
JOBS = {
    "lightning, default bar": ["lightning_job.py", "--steps", "60", "--nap", "0.3"],
    "lightning, TQDM bar": ["lightning_job.py", "--steps", "60", "--nap", "0.3", "--bar", "tqdm"],
    "HF Trainer": ["hf_trainer_job.py", "--steps", "60", "--nap", "0.3", "--out", "/tmp/hf_out"],
}
STOP_AT = 8     # the live step at which Ctrl-C is sent


def one(hosts: Path, job, log: Path) -> dict:
    argv = [sys.executable, "-m", "multihost", "run", "--hostfile", str(hosts),
            "--nproc_per_node", "2", "--code", str(PROGRAMS), "--no-check", "--json",
            "--log_dir", str(log), "--", *job]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first, steps, previous, sigint = None, set(), None, None
    for line in proc.stdout:
        record = json.loads(line) if line.startswith("{") else {}
        live = record.get("event") == "metrics" and previous == "progress"
        previous = record.get("event")
        if live and record.get("rank") == 0 and record.get("step") is not None:
            first = first or time.monotonic() - started
            steps.add(record["step"])
            if len(steps) >= STOP_AT and sigint is None:
                sigint = time.monotonic()
                proc.send_signal(signal.SIGINT)
    proc.wait()
    return {"first live step (s)": first, "live steps": len(steps),
            "Ctrl-C to exit (s)": None if sigint is None else time.monotonic() - sigint,
            "exit": proc.returncode}


def inside(runs: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        hosts = hostfile(Path(scratch), 3, "/root/work")
        for name, job in JOBS.items():
            for _ in range(runs):
                got = one(hosts, job, Path(scratch) / "log")
                print(f"{name:24s} " + "  ".join(
                    f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}" for k, v in got.items()),
                    flush=True)


if __name__ == "__main__":
    main_with_lab(__doc__, inside, hosts=3, runs=1)
