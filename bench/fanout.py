"""`multihost exec -- true` on 1, 4 and 8 lab hosts, whole command with start-up, against
plain `ssh host true` to every host in parallel, measured in the same run.

Goals (issue 2): on 8 hosts multihost takes at most 1.0x the anchor, and at most 1.5x
its own 1-host time. Run as root: python bench/fanout.py [--runs 9]
"""
from __future__ import annotations

import argparse
import sys

from _lab import addresses, bench_lab, median_of, parallel_ssh, reexec_inside, timed

SIZES = (1, 4, 8)


def inside(runs: int) -> None:
    results = {}
    for n in SIZES:
        hosts = addresses(n)
        mine = [sys.executable, "-m", "multihost", "exec", "--ips", ",".join(hosts), "--", "true"]
        results[n] = (median_of(runs, lambda: timed(mine)),
                      median_of(runs, lambda: timed(parallel_ssh(hosts, "true"))))
    print(f"{'hosts':>5} {'multihost':>10} {'ssh anchor':>10} {'ratio':>6}")
    for n, (mine, anchor) in results.items():
        print(f"{n:>5} {mine * 1000:>8.0f}ms {anchor * 1000:>8.0f}ms {mine / anchor:>6.2f}")
    eight, one = results[8][0], results[1][0]
    print(f"8 hosts vs anchor: {results[8][0] / results[8][1]:.2f}x (goal <= 1.0)")
    print(f"8 hosts vs own 1-host time: {eight / one:.2f}x (goal <= 1.5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args.runs)
        return
    with bench_lab(max(SIZES)) as lab:
        sys.exit(reexec_inside(lab, __file__, ["--runs", str(args.runs)]))


if __name__ == "__main__":
    main()
