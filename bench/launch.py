"""`multihost run --detach` on 1, 4 and 8 lab hosts: time until every rank runs, against
a plain parallel `ssh host torchrun ... &` loop measured in the same run; then the time
from a rank's failure to the last process of the run gone on every host.

Both launch real torchrun (one rank per host; the rank writes a marker file with the
time it started, on a path every host shares). Goals (issue 5): multihost at most 1.2x
the loop on 8 hosts; first failure to last process gone at most the grace (10 s by
default) plus 3 s, even when the other ranks ignore SIGTERM.
Run as root: python bench/launch.py [--runs 3]
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _lab import REPO, addresses, main_with_lab, remove_scratch

SIZES = (1, 4, 8)
GRACE = 10.0

RANK = """\
import os, signal, sys, time
markers, mode = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]
with open(os.path.join(markers, "started.%s" % rank), "w") as f:
    f.write("%.6f" % time.time())
if mode == "fail":
    if rank == "1":
        time.sleep(2)
        with open(os.path.join(markers, "failed"), "w") as f:
            f.write("%.6f" % time.time())
        os._exit(3)
    if os.environ.get("IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
"""


def hostfile(directory: Path, n: int) -> Path:
    lines = ["[defaults]", "user = root", f"python = {sys.executable}",
             f"workdir = {directory}"] + [f"[{a}]" for a in addresses(n)]
    path = directory / f"hosts{n}.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_markers(markers: Path, n: int, timeout: float = 180) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = [p for p in markers.iterdir() if p.name.startswith("started.")]
        if len(names) == n:
            return max(float(p.read_text() or 0) for p in names)
        time.sleep(0.01)
    raise SystemExit(f"bench: only {len(list(markers.iterdir()))} of {n} ranks started")


def fresh(directory: Path, tag: str) -> Path:
    markers = directory / tag
    shutil.rmtree(markers, ignore_errors=True)
    markers.mkdir()
    return markers


def multihost_launch(directory: Path, n: int, port: int) -> float:
    markers = fresh(directory, "m")
    argv = [sys.executable, "-m", "multihost", "run", "--hostfile", str(hostfile(directory, n)),
            "--no-check", "--no-sync", "--detach", "--start-port", str(port), "--",
            "rank.py", str(markers), "ok"]
    started = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=directory)
    if done.returncode:
        raise SystemExit(f"bench: multihost run failed: {done.stderr[-500:]}")
    elapsed = wait_markers(markers, n) - started
    run_id = done.stdout.split()[1]
    while True:  # let the run end (its locks free) before the next measurement
        status = subprocess.run([sys.executable, "-m", "multihost", "status", run_id, "--json"],
                                capture_output=True, text=True, cwd=directory)
        if json.loads(status.stdout)["state"] in ("succeeded", "failed", "stopped"):
            return elapsed
        time.sleep(0.3)


def ssh_loop_launch(directory: Path, n: int, port: int) -> float:
    markers = fresh(directory, "s")
    hosts = addresses(n)
    loop = " ".join(
        f"ssh -o BatchMode=yes {h} 'cd {directory} && FLAGS_START_PORT={port} {sys.executable} "
        f"-m torch.distributed.run --nnodes={n} --node_rank={k} --nproc_per_node=1 "
        f"--master_addr={hosts[0]} --master_port={port} rank.py {markers} ok' >/dev/null 2>&1 &"
        for k, h in enumerate(hosts))
    started = time.time()
    proc = subprocess.Popen(["sh", "-c", f"{loop} wait"])
    elapsed = wait_markers(markers, n) - started
    proc.wait(timeout=300)
    return elapsed


def teardown_time(directory: Path, n: int, port: int, ignore_term: bool) -> float:
    """A rank fails 2 s in; until `multihost run` returns, which it does only once every
    node's supervisor recorded its end with no process of the run left."""
    markers = fresh(directory, "f")
    env = dict(os.environ)
    argv = [sys.executable, "-m", "multihost", "run", "--hostfile", str(hostfile(directory, n)),
            "--no-check", "--no-sync", "--plain", "--start-port", str(port)]
    if ignore_term:
        argv += ["--env", "IGNORE_TERM=1"]
    argv += ["--", "rank.py", str(markers), "fail"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env,
                          cwd=directory)
    ended = time.time()
    if done.returncode != 3:
        raise SystemExit(f"bench: expected exit 3, got {done.returncode}: {done.stderr[-500:]}")
    return ended - float((markers / "failed").read_text())


def inside(runs: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix=".launch-", dir=REPO / "bench"))
    try:
        (directory / "rank.py").write_text(RANK)
        port = 18000
        rows = []
        for n in SIZES:
            mine, loop = [], []
            for _ in range(runs):
                port += 7
                mine.append(multihost_launch(directory, n, port))
                port += 7
                loop.append(ssh_loop_launch(directory, n, port))
            rows.append((n, statistics.median(mine), statistics.median(loop)))
        print("time from the command to every rank running (median of %d)" % runs)
        print(f"{'hosts':>5} {'multihost':>10} {'ssh loop':>10} {'ratio':>6}")
        for n, mine, loop in rows:
            print(f"{n:>5} {mine:>9.2f}s {loop:>9.2f}s {mine / loop:>6.2f}")
        print(f"8 hosts: {rows[-1][1] / rows[-1][2]:.2f}x the ssh loop (goal <= 1.2)")
        for ignore in (False, True):
            times = []
            for _ in range(runs):
                port += 7
                times.append(teardown_time(directory, 4, port, ignore))
            what = "ranks ignore SIGTERM" if ignore else "ranks obey SIGTERM"
            print(f"first failure to last process gone, 4 hosts, grace {GRACE:g}s, {what}: "
                  f"{statistics.median(times):.2f}s (goal <= {GRACE + 3:g}s)")
    finally:
        remove_scratch(directory)


if __name__ == "__main__":
    main_with_lab(__doc__, inside, max(SIZES), runs=3)
