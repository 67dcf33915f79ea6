"""`multihost exec -- true` on 1, 4 and 8 lab hosts, whole command with start-up, against
plain `ssh host true` to every host in parallel, measured in the same run.

Goals (issue 2): on 8 hosts multihost takes at most 1.0x the anchor, and at most 1.5x
its own 1-host time. Run as root: python bench/fanout.py [--runs 9]
"""
from __future__ import annotations

import sys

from _lab import addresses, main_with_lab, median_of, parallel_ssh, timed

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


if __name__ == "__main__":
    main_with_lab(__doc__, inside, max(SIZES), runs=9)
