"""Shared by the benchmarks: a lab of their own for the length of one run, and timing."""
from __future__ import annotations

import contextlib
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from multihost.lab import Lab  # noqa: E402


@contextlib.contextmanager
def bench_lab(hosts: int, rate: Optional[str] = None) -> Iterator[Lab]:
    lab = Lab("mhb" + secrets.token_hex(2))
    lab.up(hosts, rate=rate)
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
