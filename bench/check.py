"""Benchmark: `multihost check` on 1, 4 and 8 lab hosts, beside the anchor (plain OpenSSH
`ssh HOST true` to every host in parallel), measured in the same run, interleaved.

    sudo python bench/check.py               # brings up its own 8-host lab, tears it down
    sudo python bench/check.py --lab NAME    # reuse a running lab of at least 8 hosts

Goals (issue 3): the 8-host check costs at most 1.5x the 1-host check, and at most 1.5x
the anchor on 8 hosts: a full preflight costs little more than touching every host once.
Each measurement is the whole command, as a user runs it (a fresh process each time),
timed inside the lab's controller namespace. Prints medians and ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = (1, 4, 8)
GOAL = 1.5


def hostfile_for(lab_hostfile: str, n: int, directory: str) -> str:
    """The lab's hostfile cut to its first n hosts (defaults kept)."""
    lines, sections = [], 0
    for line in Path(lab_hostfile).read_text().splitlines():
        if line.startswith("[") and line.strip() != "[defaults]":
            sections += 1
        if sections <= n:
            lines.append(line)
    path = os.path.join(directory, f"hosts{n}.ini")
    Path(path).write_text("\n".join(lines) + "\n")
    return path


def addresses(hostfile: str):
    return [line.strip()[1:-1] for line in Path(hostfile).read_text().splitlines()
            if line.startswith("[") and line.strip() != "[defaults]"]


def timed(argv, **kw) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv[:4])}... failed ({done.returncode}): "
                         f"{done.stderr.decode(errors='replace')[-300:]}")
    return elapsed


def anchor_argv(hosts):
    """Plain OpenSSH to every host at once: what "touching every host once" costs."""
    script = 'for h in "$@"; do ssh -o BatchMode=yes -o ConnectTimeout=10 "$h" true & done; ' \
             'fail=0; for j in $(jobs -p); do wait "$j" || fail=1; done; exit $fail'
    return ["sh", "-c", script, "anchor", *hosts]


def driver(lab_hostfile: str, reps: int) -> dict:
    """Runs inside the lab's controller namespace: every measurement, interleaved."""
    times = {f"{kind}{n}": [] for kind in ("anchor", "check") for n in SIZES}
    with tempfile.TemporaryDirectory() as tmp:
        files = {n: hostfile_for(lab_hostfile, n, tmp) for n in SIZES}
        commands = {}
        for n in SIZES:
            commands[f"anchor{n}"] = anchor_argv(addresses(files[n]))
            commands[f"check{n}"] = [sys.executable, "-m", "multihost", "check", "--hostfile",
                                     files[n], "--plain"]
        for argv in commands.values():  # warm up: helper upload, page cache
            timed(argv)
        for _ in range(reps):
            for name, argv in commands.items():
                times[name].append(timed(argv))
    return times


def report(times: dict) -> int:
    """Medians, and ratios two ways: of the medians, and the median of the ratios of runs
    made back to back (the same load on a shared machine); the goals are judged on the
    second, which a busy neighbour skews least."""
    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"{'measurement':<14}{'median':>9}{'min':>9}{'max':>9}   (s, {len(times['check1'])} runs each)")
    for name, values in times.items():
        print(f"{name:<14}{med[name]:>9.3f}{min(values):>9.3f}{max(values):>9.3f}")
    print(f"\n{'ratio':<18}{'of medians':>11}{'paired':>9}")
    failed = 0
    for top, bottom, goal in (("check8", "check1", True), ("check8", "anchor8", True),
                              ("check4", "anchor4", False), ("check1", "anchor1", False)):
        paired = statistics.median(a / b for a, b in zip(times[top], times[bottom]))
        verdict = ""
        if goal:
            verdict = f"  goal <= {GOAL}: " + ("met" if paired <= GOAL else "MISSED")
            failed += paired > GOAL
        print(f"{top + ' / ' + bottom:<18}{med[top] / med[bottom]:>11.2f}{paired:>9.2f}{verdict}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", help="use this running lab instead of building one")
    parser.add_argument("--reps", type=int, default=9, help="runs of each measurement")
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the raw times as JSON")
    args = parser.parse_args()
    if args.driver:
        print(json.dumps(driver(args.driver, args.reps)))
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from multihost.lab import Lab

    lab = Lab(args.lab) if args.lab else Lab("bench" + secrets.token_hex(3))
    built = not args.lab
    try:
        if built:
            print(f"bench: bringing up lab {lab.name} with {max(SIZES)} hosts", file=sys.stderr)
            lab.up(max(SIZES))
        argv = lab.exec_argv([sys.executable, os.path.abspath(__file__), "--driver",
                              str(lab.hostfile), "--reps", str(args.reps)])
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        done = subprocess.run(argv, stdout=subprocess.PIPE, env=env, check=True)
        times = json.loads(done.stdout.decode().strip().splitlines()[-1])
    finally:
        if built:
            lab.down()
    if args.json:
        print(json.dumps(times))
    return report(times)


if __name__ == "__main__":
    sys.exit(main())
