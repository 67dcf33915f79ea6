"""Benchmark: hashing data trees, multihost's way (sha256 from hashlib, files in parallel
threads) against the coreutils command `sha256sum` on the same files (the anchor), in
one run, interleaved; plus a re-check through the hash cache.

    python bench/hash.py                 # 1 GiB in a temporary directory
    python bench/hash.py --mib 2048 --runs 5

Two trees: a dataset of many 256 KiB files, and a few 128 MiB files. The files are read
once before timing, so both sides hash from the page cache (what a re-check of a
dataset sees; a cold disk bounds both the same way). Goal (issue 4): at least 3 times
the throughput of `sha256sum`. The hashes are the same: `sha256sum` output can be
compared with multihost's by hand.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from multihost.remote.sync.fs import HashCache, default_threads, hash_files  # noqa: E402

GOAL = 3.0


def make_tree(root: Path, count: int, size: int) -> list:
    root.mkdir(parents=True)
    block = os.urandom(1 << 20)
    for i in range(count):
        with open(root / f"{i:05}.bin", "wb") as handle:
            left = size
            while left:
                piece = block[: min(left, len(block))]
                handle.write(piece)
                left -= len(piece)
            handle.write(i.to_bytes(8, "little"))  # no two files alike
    return sorted(p.name for p in root.iterdir())


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def sha256sum(root: Path, names) -> None:
    subprocess.run(["xargs", "-0", "sha256sum", "--"], input="\0".join(names).encode(), cwd=root,
                   stdout=subprocess.DEVNULL, check=True)


def sha256sum_parallel(root: Path, names) -> None:
    subprocess.run(["xargs", "-0", "-P", str(os.cpu_count() or 2), "-n", "64", "sha256sum", "--"],
                   input="\0".join(names).encode(), cwd=root, stdout=subprocess.DEVNULL, check=True)


def ours(root: Path, names) -> None:
    items = [(name, os.lstat(root / name)) for name in names]
    digests, errors, _ = hash_files(str(root), items, cache=None, verify=True)
    assert len(digests) == len(names) and not errors


def one_thread(root: Path, names, algorithm: str) -> None:
    for name in names:
        digest = hashlib.new(algorithm)
        with open(root / name, "rb") as handle:
            while True:
                chunk = handle.read(1 << 20)
                if not chunk:
                    break
                digest.update(chunk)


def bench_tree(label: str, root: Path, names, runs: int) -> float:
    total = sum((root / n).stat().st_size for n in names)
    for name in names:  # into the page cache
        with open(root / name, "rb") as handle:
            while handle.read(1 << 22):
                pass
    measures = {"sha256sum (anchor)": lambda: sha256sum(root, names),
                f"multihost, {default_threads()} threads": lambda: ours(root, names),
                "sha256sum, xargs -P": lambda: sha256sum_parallel(root, names),
                "hashlib sha256, 1 thread": lambda: one_thread(root, names, "sha256"),
                "hashlib blake2b, 1 thread": lambda: one_thread(root, names, "blake2b")}
    times = {name: [] for name in measures}
    for _ in range(runs):
        for name, fn in measures.items():
            times[name].append(timed(fn))
    print(f"\n{label}: {len(names)} files, {total / 2**20:.0f} MiB (medians of {runs} runs)")
    anchor = statistics.median(times["sha256sum (anchor)"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<28}{total / median / 1e9:>7.2f} GB/s{anchor / median:>8.2f}x")
    return anchor / statistics.median(times[f"multihost, {default_threads()} threads"])


def bench_recheck(root: Path, names, home: Path) -> float:
    """An unchanged tree checked again: stat() only, hashes from the cache."""
    items = [(name, os.lstat(root / name)) for name in names]
    cache = HashCache(str(root), str(home)).load()
    hash_files(str(root), items, cache)
    cache.save()
    started = time.perf_counter()
    cache = HashCache(str(root), str(home)).load()
    items = [(name, os.lstat(root / name)) for name in names]
    _, _, (read_files, _) = hash_files(str(root), items, cache)
    elapsed = time.perf_counter() - started
    assert read_files == 0
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="size of each tree (default 1024)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not shutil.which("sha256sum"):
        raise SystemExit("bench: sha256sum (coreutils) is not installed")
    scratch = Path(tempfile.mkdtemp(prefix="mhhash-"))
    try:
        small = scratch / "dataset"
        small_names = make_tree(small, args.mib * 4, 256 << 10)
        big = scratch / "weights"
        big_names = make_tree(big, max(1, args.mib // 128), 128 << 20)
        ratios = [bench_tree("many 256 KiB files", small, small_names, args.runs),
                  bench_tree("128 MiB files", big, big_names, args.runs)]
        recheck = bench_recheck(small, small_names, scratch / "cache")
        print(f"\nre-check of the unchanged {len(small_names)}-file tree through the cache: "
              f"{recheck * 1000:.0f} ms")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    worst = min(ratios)
    print(f"\nmultihost vs sha256sum: {worst:.2f}x at worst (goal >= {GOAL:.0f}x: "
          f"{'met' if worst >= GOAL else 'MISSED'})")
    return 0 if worst >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
