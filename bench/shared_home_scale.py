"""Benchmark: a sync into a workdir that N hosts share (one home on every host, as an
NFS export is), against the same sync to one of them, in one run.

    sudo python bench/shared_home_scale.py                  # 64 hosts, medians of 3
    sudo python bench/shared_home_scale.py --hosts 8 --runs 5

The tree is the one of bench/shared_home_bytes.py (30 MB, 1,500 files). One directory is
shown in every lab host at the same path (`lab up N --share DIR`); each measured sync
goes into a fresh workdir there, so both are first syncs: one host writes the tree, and
at N hosts a second one checks what it wrote (the others are counted as verified by
that check). A first sync of a small tree to every host
leaves each an OpenSSH master, as any earlier command would, so that neither side pays
N handshakes. The two are measured in turn (1 host, N hosts, 1 host, ...), and the ratio
of their medians is the cost of N hosts sharing the workdir. Goal (issue 35): <= 1.2x at
64 hosts.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _lab import addresses, bench_lab  # noqa: E402
from shared_home_bytes import FILES, make_tree  # noqa: E402


def sync_argv(lab, ips, workdir: Path, code: Path):
    return lab.exec_argv([sys.executable, "-m", "multihost", "sync", "--ips", ",".join(ips),
                          "--workdir", str(workdir), "--plain", "--code", str(code)])


def timed_sync(lab, ips, workdir: Path, code: Path, env) -> float:
    started = time.perf_counter()
    done = subprocess.run(sync_argv(lab, ips, workdir, code), env=env, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench: sync to {len(ips)} hosts failed:\n{done.stdout}{done.stderr}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", default=str(REPO),
                        help="the multihost checkout to measure (default: this one)")
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=args.checkout)
    with tempfile.TemporaryDirectory(prefix="mhshare-") as tmp:
        shared, code, small = Path(tmp) / "shared", Path(tmp) / "code", Path(tmp) / "small"
        shared.mkdir()
        small.mkdir()
        # In memory: the disk's fsyncs would decide both times, and vary more than they.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "mhshare", str(shared)],
                       check=True)
        try:
            return measure(args, env, shared, code, small)
        finally:
            subprocess.run(["umount", str(shared)], check=False)


def measure(args, env, shared: Path, code: Path, small: Path) -> int:
    (small / "a.py").write_text("print(1)\n")
    size = make_tree(code)
    ips = addresses(args.hosts)
    with bench_lab(args.hosts, shares=[str(shared)]) as lab:
        # Every host gets its helper and an OpenSSH master before anything is timed.
        timed_sync(lab, ips, shared / "warm", small, env)
        one, many = [], []
        for run in range(args.runs):
            one.append(timed_sync(lab, ips[:1], shared / f"one{run}", code, env))
            many.append(timed_sync(lab, ips, shared / f"all{run}", code, env))
    a, b = statistics.median(one), statistics.median(many)
    print(f"tree {size / 1e6:.1f} MB, {FILES} files; first sync into a workdir "
          f"{args.hosts} hosts share: {b:.2f} s, to one of them: {a:.2f} s "
          f"(medians of {args.runs}): {b / a:.2f}x")
    print("  1 host: " + " ".join(f"{s:.2f}" for s in one))
    print(f"  {args.hosts} hosts: " + " ".join(f"{s:.2f}" for s in many))
    return 0


if __name__ == "__main__":
    sys.exit(main())
