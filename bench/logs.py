"""Log delivery under load: 8 ranks over 4 lab hosts, each writing numbered lines as fast
as it can for 10 s. Lines per second delivered, every line counted at the end, by:

  multihost logs --follow --plain      (plain lines)
  multihost logs --follow              (the rich dashboard, on a pseudo-terminal)
  ssh host tail -F ... on every host in parallel   (the anchor)

each against a fresh run of the same job, in the same benchmark run. Rate = lines written
/ seconds from the job's start until the reader had the last line. Goals (issue 6): zero
lines lost, at least 0.8x the anchor's rate; the controller's CPU time is printed.
Run as root: python bench/logs.py [--seconds 10] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _lab import WRITER, addresses, bench_lab, reexec_inside

HOSTS, NPROC = 4, 2
LINE = re.compile(rb"\br(\d+) (\d+)$")
END = re.compile(rb"END r(\d+) (\d+)")


def multihost(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "multihost", *args], check=True,
                          capture_output=True, **kw)


def start_job(code: Path, hostfile: str, seconds: float) -> str:
    multihost("run", "--hostfile", hostfile, "--launcher", "python", "--nproc_per_node",
                     str(NPROC), "--code", str(code), "--no-check", "--detach", "--plain",
                     "--", "writer.py", str(seconds), cwd=code)
    return (Path.home() / ".multihost" / "last").read_text().strip()


def count(blobs) -> tuple:
    """(lines seen per rank are exactly 0..N-1 with N the writer's own count, total)"""
    seen, ends = {}, {}
    for blob in blobs:
        for raw in blob.splitlines():
            end = END.search(raw)
            if end:
                ends[int(end.group(1))] = int(end.group(2))
                continue
            match = LINE.search(raw)
            if match:
                seen.setdefault(int(match.group(1)), []).append(int(match.group(2)))
    complete = len(ends) == HOSTS * NPROC and all(
        sorted(seen.get(r, [])) == list(range(n)) for r, n in ends.items())
    return complete, sum(ends.values())


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def follow(code, hostfile, seconds, dashboard: bool):
    run_id = start_job(code, hostfile, seconds)
    started, cpu = time.perf_counter(), children_cpu()
    argv = [sys.executable, "-m", "multihost", "logs", run_id, "--follow"]
    if dashboard:  # a real pseudo-terminal, so the rich Live view draws as for a user
        argv = ["script", "-qfec", " ".join(argv), "/dev/null"]
    else:
        argv.append("--plain")
    out = subprocess.run(argv, cwd=code, capture_output=True, env=dict(os.environ, COLUMNS="120"))
    elapsed, cpu = time.perf_counter() - started, children_cpu() - cpu
    mirror = code / "log" / run_id
    blobs = [p.read_bytes() for p in mirror.glob("*/log/workerlog.*")]
    complete, total = count(blobs if dashboard else [out.stdout])
    return total / elapsed, complete, total, cpu


def anchor(code, hostfile, seconds):
    run_id = start_job(code, hostfile, seconds)
    started, cpu = time.perf_counter(), children_cpu()
    logs = f"~/.multihost/runs/{run_id}/log"
    # one tail per rank file: tail's headers between files would cut lines apart
    procs = [subprocess.Popen(["ssh", "-o", "BatchMode=yes", host,
                               f"tail -n +1 -F {logs}/workerlog.{local}"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
             for host in addresses(HOSTS) for local in range(NPROC)]
    blobs = [b""] * len(procs)

    def read(index, proc):  # in bulk, all at once, until the rank's END line arrived
        chunks = []
        while True:
            data = proc.stdout.read1(1 << 20)
            if not data:
                break
            chunks.append(data)
            if b"END " in chunks[-1] or (len(chunks) > 1 and b"END " in chunks[-2][-16:] + data):
                break
        proc.kill()
        proc.wait()
        blobs[index] = b"".join(chunks)

    readers = [threading.Thread(target=read, args=pair) for pair in enumerate(procs)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    elapsed, cpu = time.perf_counter() - started, children_cpu() - cpu
    complete, total = count(blobs)
    return total / elapsed, complete, total, cpu


READERS = {
    "multihost logs --follow --plain": lambda *a: follow(*a, dashboard=False),
    "multihost logs --follow (dashboard)": lambda *a: follow(*a, dashboard=True),
    "ssh tail -F, 4 hosts in parallel": anchor,
}


def inside(seconds: float, hostfile: str, repeat: int) -> None:
    runs = {name: [] for name in READERS}
    with tempfile.TemporaryDirectory(prefix="mh-bench-logs-") as tmp:
        code = Path(tmp) / "benchlogs"
        code.mkdir()
        (code / "writer.py").write_text(WRITER)
        for _ in range(repeat):  # interleaved, so that a noisy minute hits every reader
            for name, reader in READERS.items():
                runs[name].append(reader(code, hostfile, seconds))
    base = statistics.median(r[0] for r in runs["ssh tail -F, 4 hosts in parallel"])
    print(f"medians of {repeat} runs each, {HOSTS * NPROC} ranks writing for {seconds:g}s")
    print(f"{'reader':<38} {'lines/s':>10} {'lines':>10} {'lost':>5} {'cpu s':>6} {'ratio':>6}")
    for name, results in runs.items():
        rate = statistics.median(r[0] for r in results)
        total = int(statistics.median(r[2] for r in results))
        lost = "0" if all(r[1] for r in results) else "SOME"
        cpu = statistics.median(r[3] for r in results)
        print(f"{name:<38} {rate:>10.0f} {total:>10} {lost:>5} {cpu:>6.1f} {rate / base:>6.2f}")
    print("goal: zero lost, multihost >= 0.8x the anchor's rate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hostfile", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args.seconds, args.hostfile, args.repeat)
        return
    with bench_lab(HOSTS) as lab:
        sys.exit(reexec_inside(lab, __file__, ["--seconds", str(args.seconds),
                                               "--repeat", str(args.repeat),
                                               "--hostfile", str(lab.hostfile)]))


if __name__ == "__main__":
    main()
