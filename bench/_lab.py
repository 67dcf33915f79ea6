"""Shared by the benchmarks: a lab of their own for the length of one run, and timing."""
from __future__ import annotations

import contextlib
import os
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from multihost.lab import Lab  # noqa: E402


@contextlib.contextmanager
def bench_lab(hosts: int, rate: Optional[str] = None, shares: Sequence[str] = (),
              containers: bool = False) -> Iterator[Lab]:
    lab = Lab("mhb" + secrets.token_hex(2))
    lab.up(hosts, rate=rate, shares=shares, with_containers=containers)
    try:
        yield lab
    finally:
        lab.down()


def reexec_inside(lab: Lab, script: str, args: Sequence[str]) -> int:
    """Run this benchmark again as the lab's controller, so that both sides of every
    comparison start their processes the same way, inside the controller namespace."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = lab.exec_argv([sys.executable, script, "--inside", *args])
    return subprocess.call(argv, env=env)


def remove_scratch(directory: Path) -> None:
    """A bench's scratch directory, and the workdir lock its runs left beside it (a run's
    hold on a workdir is a file next to it, kept for the next run)."""
    import shutil

    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        directory.with_name(directory.name + ".multihost-lock").unlink()


def timed(argv: Sequence[str], **kw) -> float:
    started = time.perf_counter()
    done = subprocess.run(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv)[:120]} failed: {done.stderr.decode()[-300:]}")
    return elapsed


def median_of(runs: int, measure: Callable[[], float], warmup: int = 1) -> float:
    for _ in range(warmup):
        measure()
    return statistics.median(measure() for _ in range(runs))


def addresses(n: int) -> List[str]:
    from multihost.lab import host_address

    return [host_address(i) for i in range(1, n + 1)]


def parallel_ssh(hosts: Sequence[str], command: str) -> List[str]:
    """The anchor everywhere: plain OpenSSH to every host at once."""
    loop = " ".join(f"ssh -o BatchMode=yes {h} {command} &" for h in hosts)
    return ["sh", "-c", f"{loop} wait"]


def main_with_lab(doc: str, inside: Callable[[int], None], hosts: int, runs: int) -> None:
    """The command line every benchmark shares: bring up a lab of ``hosts``, then run
    ``inside(runs)`` again as its controller (``--inside``)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args.runs)
        return
    script = sys.modules["__main__"].__file__
    with bench_lab(hosts) as lab:
        sys.exit(reexec_inside(lab, script, ["--runs", str(args.runs)]))


@dataclass(frozen=True)
class Measure:
    """One command, as the controller paid for it: wall seconds, CPU seconds (user +
    system, its own and every process it waited for), and its largest process's peak
    resident memory."""
    wall: float
    cpu: float
    peak_mib: float
    stdout: str

    def with_wall(self, wall: float) -> "Measure":
        return Measure(wall, self.cpu, self.peak_mib, self.stdout)


def measured(argv: Sequence[str], ok: Sequence[int] = (0,), **kw) -> Measure:
    """Run argv to its end and measure it through wait4() (rusage of the process and of
    the descendants it reaped)."""
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, stdin=subprocess.DEVNULL, **kw)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        out, err = out.read(), err.read()
    if proc.returncode not in ok:
        raise SystemExit(f"bench: {' '.join(argv)[:120]} failed ({proc.returncode}): "
                         f"{err.decode(errors='replace')[-300:]}")
    cpu, peak = usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024
    return Measure(elapsed, cpu, peak, out.decode(errors="replace"))


def hostfile(directory: Path, n: int, workdir: Optional[str] = None) -> Path:
    """A hostfile of the lab's first n hosts (workdir: every host's, default the
    directory itself, which the hosts share with the controller)."""
    lines = ["[defaults]", "user = root", f"python = {sys.executable}",
             f"workdir = {workdir or directory}"] + [f"[{a}]" for a in addresses(n)]
    path = directory / f"hosts{n}{'-' + workdir.replace('/', '_') if workdir else ''}.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


# A rank that writes numbered lines flat out for argv[1] seconds, then an END line with its
# count: the log-following benchmarks check every line arrived once and in order.
WRITER = '''\
import os, sys, time
rank = os.environ["RANK"]
end = time.time() + float(sys.argv[1])
write = sys.stdout.write
count = 0
while time.time() < end:
    for _ in range(1000):
        write("r%s %d\\n" % (rank, count))
        count += 1
write("END r%s %d\\n" % (rank, count))
sys.stdout.flush()
'''
