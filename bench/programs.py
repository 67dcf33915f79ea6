"""Real programs on 3 lab hosts x 2 ranks (the issue's shape): a PyTorch Lightning DDP
job with its default bar (rich, where rich is installed) and with its TQDM bar, and the
Hugging Face Trainer. For each: when the first live step reaches ``--json`` (a
``metrics`` record of a bar still being drawn), how many steps were seen live, and how
long a Ctrl-C takes to end the run on every host (SIGINT to ``multihost run``, to its
exit), against the kill wait (10 s by default). The anchor: the same Lightning job
started by hand with torchrun on each host, stopped by torchrun's own Ctrl-C (SIGINT to
every host's torchrun at once, to the last one's exit: torchrun waits for its ranks).
Run as root: python bench/programs.py [--runs 1] [--only lightning] [--no-anchor]
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _lab import REPO, addresses, hostfile, main_with_lab

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
    first, steps, previous, sigint, notes = None, set(), None, None, []
    for line in proc.stdout:
        record = json.loads(line) if line.startswith("{") else {}
        if sigint is not None and record.get("event") == "notice":   # what the stop waits for
            notes.append(f"{time.monotonic() - sigint:.1f} s {record.get('host')}: {record.get('text')}")
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
            "exit": proc.returncode, "notes": notes}


def ssh(host: str, command: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-o", "BatchMode=yes", host, command], text=True,
                          capture_output=True, **kw)


def torchrun_by_hand(job) -> dict:
    """The anchor: torchrun on each of 3 hosts x 2 ranks, as its docs start it, then a
    Ctrl-C on every host at once (SIGINT to torchrun, which a terminal sends to the
    foreground process: torchrun's ranks live in sessions of their own)."""
    hosts, port = addresses(3), 29400 + os.getpid() % 500
    pids = []
    for rank, host in enumerate(hosts):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=3", f"--node_rank={rank}",
                "--nproc_per_node=2", f"--master_addr={hosts[0]}", f"--master_port={port}",
                str(PROGRAMS / job[0]), *job[1:]]
        # TTY_COMPATIBLE=1 as multihost sets it: rich's bar draws into the log
        started = ssh(host, f"cd /tmp || exit; GLOO_SOCKET_IFNAME=eth0 TTY_COMPATIBLE=1 setsid "
                            f"{shlex.join(argv)} > /tmp/torchrun.log 2>&1 < /dev/null & echo $!")
        pids.append(int(started.stdout.split()[-1]))
    seen = time.monotonic() + 300
    while time.monotonic() < seen and int(ssh(hosts[0], "grep -o train_loss /tmp/torchrun.log "
                                                       "| wc -l").stdout or 0) < 2 * STOP_AT:
        time.sleep(0.5)
    sigint = time.monotonic()
    waits = [subprocess.Popen(["ssh", "-o", "BatchMode=yes", host,
                               f"kill -INT {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.05; done"])
             for host, pid in zip(hosts, pids)]
    for wait in waits:
        wait.wait()
    return {"Ctrl-C to exit (s)": time.monotonic() - sigint}


def say(name: str, got: dict) -> None:
    notes = got.pop("notes", [])
    print(f"{name:24s} " + "  ".join(
        f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}" for k, v in got.items()),
        flush=True)
    for note in notes:
        print(f"{'':26s}{note}", flush=True)


def inside(runs: int) -> None:
    only = os.environ.get("BENCH_ONLY", "")
    with tempfile.TemporaryDirectory() as scratch:
        hosts = hostfile(Path(scratch), 3, "/root/work")
        for name, job in JOBS.items():
            if only not in name:
                continue
            for _ in range(runs):
                say(name, one(hosts, job, Path(scratch) / "log"))
            if name == "lightning, default bar" and not os.environ.get("BENCH_NO_ANCHOR"):
                for _ in range(runs):
                    say("  torchrun's own Ctrl-C", torchrun_by_hand(job))


if __name__ == "__main__":
    if "--only" in sys.argv:   # passed on to the run inside the lab through the environment
        at = sys.argv.index("--only")
        os.environ["BENCH_ONLY"] = sys.argv[at + 1]
        del sys.argv[at:at + 2]
    if "--no-anchor" in sys.argv:   # multihost's own Ctrl-C only, not torchrun's by hand
        os.environ["BENCH_NO_ANCHOR"] = "1"
        sys.argv.remove("--no-anchor")
    main_with_lab(__doc__, inside, hosts=3, runs=1)
