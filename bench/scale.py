"""Sixty-four hosts (issue 12): each command at 8, 32 and 64 lab hosts, beside its anchor
in the same run, with the controller's wall time, CPU seconds and peak memory.

    sudo python bench/scale.py exec        # multihost exec -- true   vs parallel `ssh host true`
    sudo python bench/scale.py check       # multihost check          vs parallel `ssh host true`
    sudo python bench/scale.py launch      # run --detach to every rank running
                                           #                          vs parallel `ssh host launcher &`
    sudo python bench/scale.py teardown    # first failure to `run` returning (goal: grace + 3 s)
    sudo python bench/scale.py sync        # first and no-change sync vs parallel rsync
    sudo python bench/scale.py logs        # logs --follow --plain of N x 8 ranks writing
                                           # flat out   vs `ssh host tail -F` per host
    options: --sizes 8,32,64  --runs 3

Each brings up its own 64-host lab and takes it down. Every measurement is the whole
command as a user runs it (a fresh process, started inside the lab's controller
namespace); CPU and peak memory come from wait4() on that process, so they include every
process it waited for (ssh clients), not a connection master it left running. All lab
hosts share this machine's cores: wall times are the cores' as much as the network's, so
the ratios (both sides under the same load, interleaved) and the controller's CPU are
the figures to read.

Goals at 64 hosts: every command at most 1.0x its anchor's wall time; controller CPU per
host per command under 30 ms for exec and check; teardown within the grace + 3 s; log
following at least the anchor's line rate, every line exactly once.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import threading
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lab import (REPO, WRITER, Measure, addresses, bench_lab, hostfile, measured,  # noqa: E402
                  parallel_ssh, reexec_inside, remove_scratch)

LAB_HOSTS = 64
GRACE = 2.0
MH = [sys.executable, "-m", "multihost"]

RANK = """\
import os, sys, time
markers, mode = sys.argv[1], sys.argv[2]
rank = os.environ.get("RANK", "0")
with open(os.path.join(markers, "started.%s" % rank), "w") as f:
    f.write("%.6f %d" % (time.time(), os.getpid()))
if mode == "fail" and rank == "0":
    # Fail once every rank runs, so the span measured is the teardown alone.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    while sum(n.startswith("started.") for n in os.listdir(markers)) < world:
        time.sleep(0.05)
    time.sleep(1)
    with open(os.path.join(markers, "failed"), "w") as f:
        f.write("%.6f" % time.time())
    os._exit(3)
time.sleep(600)
"""


# -- the measurements: each returns (multihost, anchor) Measures -------------------------
def bench_exec(work: Path, n: int) -> tuple:
    return (measured(MH + ["exec", "--hostfile", str(hostfile(work, n)), "--", "true"]),
            measured(parallel_ssh(addresses(n), "true")))


def bench_check(work: Path, n: int) -> tuple:
    return (measured(MH + ["check", "--hostfile", str(hostfile(work, n)), "--plain"]),
            measured(parallel_ssh(addresses(n), "true")))


def wait_markers(markers: Path, n: int, timeout: float = 300) -> float:
    """When the last of n ranks started (their own clock), once all have."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = [p for p in markers.iterdir() if p.name.startswith("started.")]
        if len(names) == n:
            return max(float(p.read_text().split()[0]) for p in names)
        time.sleep(0.02)
    raise SystemExit(f"bench: only {len(list(markers.iterdir()))} of {n} ranks started")


def fresh(work: Path, tag: str) -> Path:
    markers = work / tag
    shutil.rmtree(markers, ignore_errors=True)
    markers.mkdir()
    return markers


def bench_launch(work: Path, n: int) -> tuple:
    markers = fresh(work, "m")
    started = time.time()
    mine = measured(MH + ["run", "--hostfile", str(hostfile(work, n)), "--launcher", "python",
                          "--code", str(work), "--no-check", "--no-sync", "--detach", "--", "rank.py",
                          str(markers), "ok"])
    mine = mine.with_wall(max(mine.wall, wait_markers(markers, n) - started))
    run_id = mine.stdout.split()[1]
    measured(MH + ["stop", run_id, "--kill-wait", "1"], ok=(0, 1))

    markers = fresh(work, "s")
    hosts = addresses(n)
    # Only the rank goes to the background, its output away from the session: with
    # `cd && rank &` the shell's backgrounded subshell keeps ssh's stdout open, and ssh
    # (so the measurement) waits for the rank to end, ten minutes later.
    loop = " ".join(f"ssh -o BatchMode=yes {h} 'cd {work}; RANK={k} nohup {sys.executable} "
                    f"rank.py {markers} ok </dev/null >/dev/null 2>&1 &' &"
                    for k, h in enumerate(hosts))
    started = time.time()
    anchor = measured(["sh", "-c", f"{loop} wait"])
    anchor = anchor.with_wall(max(anchor.wall, wait_markers(markers, n) - started))
    # The loop's ranks, each by the pid it wrote (host k ran RANK=k).
    kills = " ".join(f"ssh -o BatchMode=yes {h} kill "
                     f"{(markers / f'started.{k}').read_text().split()[1]} &"
                     for k, h in enumerate(hosts))
    measured(["sh", "-c", f"{kills} wait"])
    return mine, anchor


def bench_teardown(work: Path, n: int) -> tuple:
    """Rank 0 fails once every rank runs; from then until `multihost run` returns, which it does only once every
    node's supervisor recorded its end with no process of the run left. No anchor: the
    goal is the grace plus 3 s (the wall shown is that span, not the whole run)."""
    markers = fresh(work, "f")
    mine = measured(MH + ["run", "--hostfile", str(hostfile(work, n)), "--launcher", "python",
                          "--code", str(work), "--no-check", "--no-sync", "--plain",
                          "--kill-wait", str(GRACE),
                          "--", "rank.py", str(markers), "fail"], ok=(3,))
    ended = time.time()
    span = ended - float((markers / "failed").read_text())
    return mine.with_wall(span), None


def make_tree(root: Path) -> None:
    """Two 32 MB files and 500 small ones (1-8 KB)."""
    import random
    rng = random.Random(12)
    (root / "big").mkdir(parents=True)
    for i in range(2):
        with open(root / "big" / f"weights{i}.bin", "wb") as f:
            for _ in range(32):
                f.write(rng.randbytes(1000 * 1000))
    for i in range(500):
        sub = root / f"pkg{i % 20}"
        sub.mkdir(exist_ok=True)
        (sub / f"m{i}.py").write_bytes(rng.randbytes(rng.randint(1000, 8000)))


def bench_sync(work: Path, n: int) -> tuple:
    tree = work / "tree"
    if not tree.exists():
        make_tree(tree)
    hosts = addresses(n)
    measured(parallel_ssh(hosts, "rm -rf /root/synced /root/rsync-tree"))
    sync = MH + ["sync", "--hostfile", str(hostfile(work, n, "/root/synced")), "--code",
                 str(tree), "--plain"]
    first = measured(sync)
    again = measured(sync)
    rsync = " ".join(f"rsync -a {tree}/ {h}:/root/rsync-tree/ &" for h in hosts)
    rfirst = measured(["sh", "-c", f"{rsync} wait"])
    ragain = measured(["sh", "-c", f"{rsync} wait"])
    return (first, rfirst), (again, ragain)


NPROC_LOGS = 8
LOG_SECONDS = 3.0
LINE = re.compile(rb"\br(\d+) (\d+)$")
END = re.compile(rb"END r(\d+) (\d+)")
TAIL_HEADER = re.compile(rb"(?:^|\n)==> workerlog\.(\d+) <==\n")


class Counter:
    """Every rank's lines must arrive as 0, 1, 2 ... up to the count its END line gives:
    once each, none missing (a lost or repeated line breaks the sequence)."""

    def __init__(self) -> None:
        self.next: Dict[int, int] = {}
        self.ends: Dict[int, int] = {}
        self.bad = 0

    def feed(self, text: bytes) -> None:
        for raw in text.splitlines():
            end = END.search(raw)
            if end:
                self.ends[int(end.group(1))] = int(end.group(2))
                continue
            match = LINE.search(raw)
            if match:
                rank, number = int(match.group(1)), int(match.group(2))
                if number != self.next.get(rank, 0):
                    self.bad += 1
                self.next[rank] = number + 1

    def verdict(self, ranks: int) -> tuple:
        """(every line exactly once, lines written)"""
        exact = (self.bad == 0 and len(self.ends) == ranks
                 and all(self.next.get(r, 0) == n for r, n in self.ends.items()))
        return exact, sum(self.ends.values())


def start_writers(work: Path, n: int) -> str:
    out = measured(MH + ["run", "--hostfile", str(hostfile(work, n)), "--launcher", "python",
                         "--nproc_per_node", str(NPROC_LOGS), "--code", str(work),
                         "--no-check", "--no-sync", "--detach", "--allow-concurrent", "--",
                         "writer.py", str(LOG_SECONDS)])
    return out.stdout.split()[1]


def follow_logs(work: Path, n: int) -> Measure:
    """`multihost logs RUN --follow --plain` to its end, its lines counted from a file."""
    run_id = start_writers(work, n)
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        proc = subprocess.Popen(MH + ["logs", run_id, "--follow", "--plain"], stdout=out,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=work)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        out.seek(0)
        counter = Counter()
        for block in iter(lambda: out.read(8 << 20), b""):
            cut = block.rfind(b"\n") + 1
            counter.feed(block[:cut])
            if cut < len(block):
                out.seek(cut - len(block), os.SEEK_CUR)
    exact, total = counter.verdict(n * NPROC_LOGS)
    return Measure(elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
                   f"{total} {'exact' if exact and os.waitstatus_to_exitcode(status) == 0 else 'LOST'}")


def tail_logs(work: Path, n: int) -> Measure:
    """The anchor: `ssh host tail -n +1 -F workerlog.0 ... workerlog.7` on every host at
    once, each read until its 8 END lines came; the files are split apart again by
    tail's headers."""
    run_id = start_writers(work, n)
    files = " ".join(f"workerlog.{k}" for k in range(NPROC_LOGS))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    procs = [subprocess.Popen(["ssh", "-o", "BatchMode=yes", host,
                               f"cd ~/.multihost/runs/{run_id}/log && tail -n +1 -F {files}"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL) for host in addresses(n)]
    counters = [Counter() for _ in procs]

    def read(index: int, proc) -> None:
        chunks, ends, tail = [], 0, b""
        while ends < NPROC_LOGS:
            data = proc.stdout.read1(1 << 20)
            if not data:
                break
            chunks.append(data)
            ends += (tail + data).count(b"END r") - tail.count(b"END r")
            tail = data[-8:]
        proc.kill()
        proc.wait()
        parts = TAIL_HEADER.split(b"".join(chunks))   # ['', '0', bytes, '3', bytes, ...]
        by_file: Dict[bytes, List[bytes]] = {}
        for name, body in zip(parts[1::2], parts[2::2]):
            by_file.setdefault(name, []).append(body)
        for bodies in by_file.values():
            counters[index].feed(b"".join(bodies))

    readers = [threading.Thread(target=read, args=pair) for pair in enumerate(procs)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    exact = all(c.verdict(NPROC_LOGS)[0] for c in counters)
    total = sum(c.verdict(NPROC_LOGS)[1] for c in counters)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Measure(elapsed, cpu, after.ru_maxrss / 1024, f"{total} {'exact' if exact else 'LOST'}")


def bench_logs(work: Path, n: int) -> tuple:
    (work / "writer.py").write_text(WRITER)
    return follow_logs(work, n), tail_logs(work, n)


BENCHES: Dict[str, Callable] = {"exec": bench_exec, "check": bench_check,
                                "launch": bench_launch, "teardown": bench_teardown,
                                "sync": bench_sync, "logs": bench_logs}


# -- the report ------------------------------------------------------------------------
def median_measure(measures: Sequence[Measure]) -> Measure:
    return Measure(statistics.median(m.wall for m in measures),
                   statistics.median(m.cpu for m in measures),
                   max(m.peak_mib for m in measures), "")


def report(name: str, rows: Dict[str, Dict[int, List[tuple]]]) -> None:
    print(f"\n{name}: median of the runs; CPU and peak memory are the controller's "
          f"(the command and what it waited for)")
    print(f"{'case':<12}{'hosts':>6}{'wall s':>9}{'cpu s':>8}{'cpu/host':>10}{'peak MiB':>10}"
          f"{'anchor s':>10}{'a.cpu s':>9}{'ratio':>7}")
    for case, by_n in rows.items():
        for n, pairs in by_n.items():
            mine = median_measure([p[0] for p in pairs])
            line = (f"{case:<12}{n:>6}{mine.wall:>9.2f}{mine.cpu:>8.2f}"
                    f"{mine.cpu / n * 1000:>8.1f}ms{mine.peak_mib:>10.0f}")
            if pairs[0][1] is not None:
                anchor = median_measure([p[1] for p in pairs])
                paired = statistics.median(p[0].wall / p[1].wall for p in pairs)
                line += f"{anchor.wall:>10.2f}{anchor.cpu:>9.2f}{paired:>7.2f}"
            if case == "logs":  # lines, and whether every one came exactly once
                line += "  " + "; ".join(f"{p[0].stdout} vs {p[1].stdout}" for p in pairs)
                line += "  lines/s " + ", ".join(
                    f"{int(p[0].stdout.split()[0]) / p[0].wall:.0f} vs "
                    f"{int(p[1].stdout.split()[0]) / p[1].wall:.0f}" for p in pairs)
            print(line)
    print("ratio: the median of multihost/anchor over runs made back to back. All lab "
          "hosts and the controller share this machine's cores (and other work on it).")


def inside(name: str, sizes: Sequence[int], runs: int) -> None:
    work = Path(tempfile.mkdtemp(prefix=".scale-", dir=REPO / "bench"))
    try:
        (work / "rank.py").write_text(RANK)
        rows: Dict[str, Dict[int, List[tuple]]] = {}
        for n in sizes:
            BENCHES[name](work, n)      # warm up: helper upload, code synced, page cache
            for _ in range(runs):
                result = BENCHES[name](work, n)
                cases = ({"first": result[0], "no-change": result[1]} if name == "sync"
                         else {name: result})
                for case, pair in cases.items():
                    rows.setdefault(case, {}).setdefault(n, []).append(pair)
        report(name, rows)
    finally:
        remove_scratch(work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench", choices=sorted(BENCHES))
    parser.add_argument("--sizes", default="8,32,64")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.inside:
        inside(args.bench, sizes, args.runs)
        return 0
    with bench_lab(max(LAB_HOSTS, *sizes)) as lab:
        return reexec_inside(lab, os.path.abspath(__file__),
                             [args.bench, "--sizes", args.sizes, "--runs", str(args.runs)])


if __name__ == "__main__":
    sys.exit(main())
