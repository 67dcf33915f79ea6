"""Benchmark: the bus bandwidth `multihost check --collective` reports, beside a plain
torch all_reduce script started by hand with torchrun on every host over ssh (the
anchor, bench/allreduce_plain.py), in the same lab, interleaved.

    sudo python bench/collective.py                     # 4 hosts, every link 200mbit
    sudo python bench/collective.py --hosts 8 --rate 100mbit --runs 2

Goal (issue 15): the check's all_reduce busbw within 10% of the anchor's at every size
from 1 MiB up that both measured: there the time is the bandwidth's. Below it the time is
the latency of small messages, which on a shared, busy machine is its CPU scheduler's;
those rows are printed, not judged. The links are shaped so that the figures are the network's: unshaped, a
lab's links are as fast as this machine's (shared, busy) CPUs copy bytes. Prints, per
size, the best of the runs for each side and their ratio, and how long each side took.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _lab import addresses, bench_lab, reexec_inside  # noqa: E402

PLAIN = Path(__file__).resolve().parent / "allreduce_plain.py"
SIZES = "1K-4M"
PORT = 29500
GOAL = 0.10
JUDGED_FROM = 1 << 20


def anchor(hosts, sizes) -> dict:
    """torchrun on every host over ssh, as a user starts it by hand."""
    ssh = ["ssh", "-o", "BatchMode=yes"]
    for host in hosts:
        with open(PLAIN, "rb") as f:
            subprocess.run(ssh + [host, "cat > /tmp/allreduce_plain.py"], stdin=f, check=True)
    argv = lambda k: ssh + [hosts[k], f"GLOO_SOCKET_IFNAME=eth0 {sys.executable} -m "
                            f"torch.distributed.run --nnodes {len(hosts)} --node_rank {k} "
                            f"--nproc_per_node 1 --master_addr {hosts[0]} --master_port {PORT} "
                            f"/tmp/allreduce_plain.py --sizes {','.join(map(str, sizes))}"]
    started = time.perf_counter()
    procs = [subprocess.Popen(argv(k), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(len(hosts))]
    outs = [p.communicate(timeout=600) for p in procs]
    elapsed = time.perf_counter() - started
    for line in outs[0][0].splitlines():
        if line.startswith("ANCHOR "):
            return {int(k): v for k, v in json.loads(line[7:]).items()}, elapsed
    raise SystemExit(f"bench: the anchor printed nothing: {outs[0][1][-500:]}")


def check(hostfile, sizes_text) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "multihost", "check", "--hostfile", hostfile,
                           "--json", "--collective", "--collective-sizes", sizes_text],
                          capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    doc = json.loads(done.stdout)["collective"]
    if not doc["ok"]:
        raise SystemExit(f"bench: the check's collective failed: {doc}")
    rows = {r["bytes"]: r["busbw_GBps"] * 1e9 for r in doc["collective"]["rows"]
            if r["op"] == "all_reduce"}
    return rows, elapsed, doc


def inside(args) -> None:
    from multihost.check.collective import human_size, parse_sizes

    sizes = parse_sizes(args.sizes)
    hosts = addresses(args.hosts)
    hostfile = str(Path(args.hostfile))
    best_anchor, best_check, times = {}, {}, {"anchor": [], "check": []}
    doc = None
    for _ in range(args.runs):
        got, spent = anchor(hosts, sizes)
        times["anchor"].append(spent)
        for size, value in got.items():
            best_anchor[size] = max(best_anchor.get(size, 0.0), value)
        got, spent, doc = check(hostfile, args.sizes)
        times["check"].append(spent)
        for size, value in got.items():
            best_check[size] = max(best_check.get(size, 0.0), value)
    print(f"{args.hosts} hosts, links {args.rate}, gloo, 1 rank per host; best of {args.runs} "
          "runs each, interleaved")
    print(f"{'size':>8}  {'anchor busbw':>13}  {'check busbw':>12}  {'check/anchor':>12}")
    worst = 0.0
    for size in sizes:
        if size not in best_anchor or size not in best_check:
            continue
        ratio = best_check[size] / best_anchor[size]
        if size >= JUDGED_FROM:
            worst = max(worst, abs(ratio - 1))
        print(f"{human_size(size):>8}  {best_anchor[size] / 1e6:>9.2f} MB/s  "
              f"{best_check[size] / 1e6:>8.2f} MB/s  {ratio:>12.2f}"
              + ("" if size >= JUDGED_FROM else "  (latency-bound: not judged)"))
    print(f"anchor wall {min(times['anchor']):.1f}s (torchrun on each host over ssh); check "
          f"--collective wall {min(times['check']):.1f}s (preflight, links and job; "
          f"{doc['links_duration_s']:.1f}s links, job {doc['collective']['timings_s']})")
    print(f"worst difference from {human_size(JUDGED_FROM)} up: {worst:.0%} (goal {GOAL:.0%}): "
          f"{'met' if worst <= GOAL else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--hostfile", help=argparse.SUPPRESS)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args)
        return
    with bench_lab(args.hosts, rate=args.rate) as lab:
        sys.exit(reexec_inside(lab, __file__, [
            "--hosts", str(args.hosts), "--rate", args.rate, "--sizes", args.sizes,
            "--runs", str(args.runs), "--hostfile", str(lab.hostfile)]))


if __name__ == "__main__":
    main()
