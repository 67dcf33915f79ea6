"""Sync at scale (issue 12): a first sync of a large tree to 4, 16 and 64 hosts whose
links and the controller's own port are shaped, against two anchors in the same run:

  pipelined  a chain `tar c | ssh h1 'tee >(tar x) | ssh h2 ...'`: every byte leaves the
             controller once and each host forwards it as it arrives; the fastest known
             way to put the same bytes on N machines
  rsync      `rsync -a` over ssh to every host in parallel (N copies on the uplink)

    sudo python bench/sync_scale.py                        # 4,16,64 hosts, 1 Gbit/s
    sudo python bench/sync_scale.py --sizes 4,16 --runs 3 --rate 500mbit --big-mb 64
    sudo python bench/sync_scale.py --sizes 64 --runs 1 --rate 40mbit --tools multihost,pipelined

For each, the wall time, the controller's CPU seconds and peak memory (wait4() of the
command: it and every process it waited for), and the bytes that left the controller:
the tx counter of the lab bridge's own port in the controller namespace, which carries
what the controller's stack sends and nothing that hosts switch between themselves
(frames, so TCP/IP headers and ACKs included). "copies" is those bytes over the tree's
size: 1.0 is one copy on the uplink, N is one per host.

Every lab host runs on this machine's cores (2 here) and writes to its disk: wall times
are the cores' as much as the links', so the ratios (each beside its anchor, in turn,
in the same run) and the controller's CPU and bytes are the figures to read. A rate low
enough that the links, not the cores, decide shows what a real network would: the "busy"
column is the whole machine's CPU use during the command (100% = every core), which
must stay well below 100% for the wall times to be the links'.
Goals: multihost's uplink bytes about one copy at every N; wall time nearly flat in N
and at most 1.2x the pipelined anchor.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lab import (REPO, Measure, addresses, bench_lab, hostfile, measured, parallel_ssh,  # noqa: E402
                  reexec_inside)

MH = [sys.executable, "-m", "multihost"]
HOP_SSH = "ssh -o BatchMode=yes -o Compression=no -c aes128-gcm@openssh.com"
TOOLS = ("multihost", "pipelined", "rsync")
DEST = {"multihost": "/root/scale-mh", "pipelined": "/root/scale-pipe", "rsync": "/root/scale-rs"}


def make_tree(root: Path, big_mb: int, small: int) -> int:
    """One big file of big_mb MB and `small` files of 1-16 KB; returns the bytes."""
    rng = random.Random(12)
    root.mkdir(parents=True)
    total = 0
    with open(root / "weights.bin", "wb") as handle:
        for _ in range(big_mb):
            handle.write(os.urandom(1000 * 1000))
    total += big_mb * 1000 * 1000
    for i in range(small):
        path = root / f"pkg{i % 40}" / f"sub{i % 7}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(rng.randint(1024, 16 * 1024))
        path.write_bytes(data)
        total += len(data)
    return total


def cpu_jiffies() -> tuple:
    """(busy, total) CPU time of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:9]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def uplink_bytes() -> int:
    """What the controller's stack has sent into the lab switch (netlink: exact, and
    independent of /sys)."""
    shown = subprocess.run(["ip", "-s", "-j", "link", "show", "dev", "br0"], capture_output=True,
                           text=True, check=True).stdout
    return int(json.loads(shown)[0]["stats64"]["tx"]["bytes"])


# Each host runs this from the checkout (every lab host sees it at the same path): it
# unpacks what it reads and, as it reads it, passes it on to the next host.
CHAIN = """\
dest=$1; shift
mkdir -p "$dest" || exit 1
[ $# -eq 0 ] && exec tar x -C "$dest"
next=$1; shift
fifo=/tmp/scale-pipe.fifo
rm -f $fifo && mkfifo $fifo || exit 1
tar x -C "$dest" < $fifo &
tee $fifo | HOP_SSH $next sh "$0" "$dest" "$@"
s=$?
wait $! || exit 1
exit $s
"""


def pipelined(script: Path, tree: Path, hosts: Sequence[str], dest: str) -> List[str]:
    """The chain anchor: `tar c | ssh h1 'tee >(tar x) | ssh h2 ...'`."""
    return ["sh", "-c", f"tar c -C {tree} . | {HOP_SSH} {hosts[0]} sh {script} {dest} "
                        + " ".join(hosts[1:])]


def rsync_all(tree: Path, hosts: Sequence[str], dest: str) -> List[str]:
    loop = " ".join(f"rsync -a {tree}/ {h}:{dest}/ &" for h in hosts)
    return ["sh", "-c", f"{loop} wait"]


def one_run(work: Path, tree: Path, n: int, order: Sequence[str]) -> Dict[str, tuple]:
    """{tool: (Measure, bytes sent by the controller, the machine's CPU busy fraction)}"""
    hosts = addresses(n)
    commands = {
        "multihost": MH + ["sync", "--hostfile", str(hostfile(work, n, DEST["multihost"])),
                           "--code", str(tree), "--plain"],
        "pipelined": pipelined(work / "chain.sh", tree, hosts, DEST["pipelined"]),
        "rsync": rsync_all(tree, hosts, DEST["rsync"]),
    }
    cache = Path.home() / ".cache" / "multihost"
    out: Dict[str, tuple] = {}
    for tool in order:
        measured(parallel_ssh(hosts, f"rm -rf {DEST[tool]}"))
        if tool == "multihost":   # a first sync: nothing known of the tree or the hosts
            shutil.rmtree(cache / "hashes", ignore_errors=True)
            shutil.rmtree(cache / "sync-state", ignore_errors=True)
        before, cpu_before = uplink_bytes(), cpu_jiffies()
        measure = measured(commands[tool])
        cpu_after = cpu_jiffies()
        busy = (cpu_after[0] - cpu_before[0]) / max(1, cpu_after[1] - cpu_before[1])
        out[tool] = (measure, uplink_bytes() - before, busy)
        measured(parallel_ssh(hosts, f"test -s {DEST[tool]}/weights.bin"))  # it arrived
        measured(parallel_ssh(hosts, f"rm -rf {DEST[tool]}"))  # the disk is this machine's
    return out


def inside(sizes: Sequence[int], runs: int, big_mb: int, small: int, rate: str,
           warmup: bool, tools: Sequence[str]) -> None:
    # In the checkout: the hosts see the chain's script at the same path.
    work = Path(tempfile.mkdtemp(prefix=".scale-sync-", dir=REPO / "bench"))
    try:
        (work / "chain.sh").write_text(CHAIN.replace("HOP_SSH", HOP_SSH))
        tree = work / "tree"
        size = make_tree(tree, big_mb, small)
        print(f"bench: load average at the start: {os.getloadavg()[0]:.1f}", file=sys.stderr,
              flush=True)
        rows: Dict[int, List[Dict[str, tuple]]] = {}
        for n in sizes:
            if warmup:   # the helper on the hosts, the page cache
                one_run(work, tree, n, tools)
            for run in range(runs):
                order = tuple(tools) if run % 2 == 0 else tuple(reversed(tools))
                rows.setdefault(n, []).append(one_run(work, tree, n, order))
                print(f"bench: {n} hosts, run {run + 1}/{runs} done", file=sys.stderr, flush=True)
        report(rows, size, big_mb, small, rate, tools)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def median_of(values) -> float:
    return statistics.median(list(values))


def report(rows: Dict[int, List[Dict[str, tuple]]], size: int, big_mb: int, small: int,
           rate: str, tools: Sequence[str]) -> None:
    print(f"first sync of {size / 1e6:.0f} MB (1 file of {big_mb} MB + {small} files of 1-16 KB), "
          f"every link and the controller's port shaped to {rate}")
    print("medians; cpu and peak memory are the controller's; copies = bytes sent by the "
          "controller / tree size; ratio = multihost / pipelined over runs made back to back")
    print(f"{'hosts':>5} {'tool':<10}{'wall s':>8}{'cpu s':>8}{'peak MiB':>9}{'MB sent':>9}"
          f"{'copies':>7}{'busy':>6}{'ratio':>7}")
    for n, runs in rows.items():
        for tool in tools:
            measures: List[Measure] = [r[tool][0] for r in runs]
            sent = median_of(r[tool][1] for r in runs)
            busy = median_of(r[tool][2] for r in runs)
            ratio = (median_of(r[tool][0].wall / r["pipelined"][0].wall for r in runs)
                     if "pipelined" in tools else float("nan"))
            print(f"{n:>5} {tool:<10}{median_of(m.wall for m in measures):>8.2f}"
                  f"{median_of(m.cpu for m in measures):>8.2f}{max(m.peak_mib for m in measures):>9.0f}"
                  f"{sent / 1e6:>9.1f}{sent / size:>7.2f}{busy:>6.0%}{ratio:>7.2f}")
    print("All lab hosts and the controller share this machine's cores: read the ratios, "
          "the controller's CPU and the bytes, not the wall times alone.")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print("all: " + json.dumps({n: [{t: [round(m.wall, 3), round(m.cpu, 3), b, round(c, 2)]
                                     for t, (m, b, c) in r.items()}
                                    for r in runs] for n, runs in rows.items()}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4,16,64")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", default="1gbit", help="every link and the controller's port")
    parser.add_argument("--big-mb", type=int, default=64, help="the big file, MB")
    parser.add_argument("--small", type=int, default=2000, help="small files of 1-16 KB")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help="which of multihost,pipelined,rsync to run (rsync sends N copies: "
                             "at 64 hosts over slow links it takes long)")
    parser.add_argument("--no-warmup", action="store_true",
                        help="no warm-up round (the first run then installs the helper)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    tools = [t for t in TOOLS if t in args.tools.split(",")]
    if args.inside:
        inside(sizes, args.runs, args.big_mb, args.small, args.rate, not args.no_warmup, tools)
        return 0
    with bench_lab(max(sizes), rate=args.rate) as lab:
        return reexec_inside(lab, os.path.abspath(__file__),
                             ["--sizes", args.sizes, "--runs", str(args.runs), "--rate", args.rate,
                              "--big-mb", str(args.big_mb), "--small", str(args.small),
                              "--tools", ",".join(tools)]
                             + (["--no-warmup"] if args.no_warmup else []))


if __name__ == "__main__":
    sys.exit(main())
