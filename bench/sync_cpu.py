"""Where the CPU of a first sync goes: every process of the lab, by kind, for multihost's
first sync and for the parallel-rsync anchor of `bench/scale.py sync` (same tree).

    sudo python bench/sync_cpu.py --hosts 64 [--runs 1]

The controller's own CPU (what `bench/scale.py` reports) is a small part of a first sync:
all lab hosts share this machine's cores, so the sshds, helpers and ssh clients of every
host count as much. This samples every CPU with `perf record -e cpu-clock -a` while each
command runs and names each sample's process by its command line (read from /proc while
it runs): controller, host helper by operation, ssh client and sshd by what they carry.
Only the processes in this lab's network namespaces are named; other work on the
machine (another lab's sync is made of the same kinds) shows as "not this lab", and
"not seen" are processes that ended before they could be named. Needs `perf`.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lab import (REPO, addresses, bench_lab, hostfile, measured, parallel_ssh,  # noqa: E402
                  reexec_inside)
from scale import MH, make_tree  # noqa: E402

FREQUENCY = 199  # samples a second on each CPU
KERNEL_THREADS = ("kworker", "ksoftirq", "kswapd", "kdamond", "jbd2", "rcu_")
OP = re.compile(r"__main__\.py['\"]? (\w+\.\w+)")


class Names(threading.Thread):
    """pid -> (comm, command line, parent pid), read from /proc every 0.2 s; a shell is
    read again until it has exec'd what it runs."""

    def __init__(self, lab_namespaces: set) -> None:
        super().__init__(daemon=True)
        self.lab_namespaces = lab_namespaces
        self.seen: Dict[int, Tuple[str, str, int]] = {}
        self.done = threading.Event()

    def read(self, pid: int) -> Optional[Tuple[str, str, int]]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            net = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            return None
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm.startswith(KERNEL_THREADS):
            return comm, "", 2
        if int(net[net.index("[") + 1:-1]) not in self.lab_namespaces:
            return "not this lab", "", 0
        return comm, cmd, int(stat[stat.rindex(")") + 2:].split()[1])

    def run(self) -> None:
        while not self.done.is_set():
            for name in os.listdir("/proc"):
                if name.isdigit():
                    pid = int(name)
                    old = self.seen.get(pid)
                    if old is None or old[0] in ("sh", "bash", "sshd"):
                        got = self.read(pid)
                        if got:
                            self.seen[pid] = got
            time.sleep(0.2)


def kind(pid: int, names: Dict[int, Tuple[str, str, int]], command: int) -> str:
    info = names.get(pid)
    if pid == 0:
        return "idle"
    if info is None:
        return "not seen"
    comm, cmd, _ = info
    op = OP.search(cmd)
    if pid == command:
        return "controller (multihost)"
    if op:
        if comm == "ssh":
            return f"ssh client carrying {op.group(1)}"
        return f"host helper {op.group(1)}"
    if comm == "sshd":
        served = [kind(child, names, command) for child, v in names.items() if v[2] == pid]
        for what in served:
            if what.startswith(("host helper", "host rsync")):
                return f"sshd for {what}"
        return "sshd (handshakes, other sessions)"
    if comm == "rsync":
        return "host rsync --server" if "--server" in cmd else "controller rsync"
    if comm == "ssh":
        return "controller ssh for rsync" if "rsync" in cmd else "ssh (masters, other)"
    if comm.startswith(KERNEL_THREADS):
        return "kernel threads"
    if comm == "not this lab":
        return comm
    return "other"


def lab_namespaces(lab: str, n: int) -> set:
    """The inode numbers of the lab's network namespaces: its controller's and hosts'."""
    from multihost.lab.config import ctl_netns, host_netns

    names = [ctl_netns(lab)] + [host_netns(lab, i) for i in range(1, n + 1)]
    return {os.stat(f"/run/netns/{name}").st_ino for name in names}


def profile(label: str, argv, work: Path, namespaces: set) -> float:
    names = Names(namespaces)
    names.start()
    data = str(work / "perf.data")
    perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-a", "-F",
                             str(FREQUENCY), "-o", data],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, _ = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    error = proc.stderr.read()
    perf.send_signal(2)
    perf.wait()
    names.done.set()
    names.join()
    script = subprocess.run(["perf", "script", "-i", data, "-F", "pid"], capture_output=True,
                            text=True).stdout
    os.unlink(data)
    samples = Counter(int(line) for line in script.split() if line.isdigit())
    seconds: Dict[str, float] = defaultdict(float)
    processes: Dict[str, set] = defaultdict(set)
    for pid, count in samples.items():
        what = kind(pid, names.seen, proc.pid)
        seconds[what] += count / FREQUENCY
        processes[what].add(pid)
    busy = sum(v for k, v in seconds.items() if k != "idle")
    print(f"\n{label}: wall {wall:.2f} s, exit {status}, CPU of the whole machine while it "
          f"ran {busy:.1f} s, load {load:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    if status:
        print("  " + error.decode(errors="replace")[-300:])
    for what, value in sorted(seconds.items(), key=lambda kv: -kv[1]):
        if value >= 0.05 and what != "idle":
            print(f"  {value:7.2f} s {100 * value / busy:5.1f}% {len(processes[what]):5d} procs  {what}")
    return wall


def inside(n: int, runs: int, lab: str) -> None:
    namespaces = lab_namespaces(lab, n)
    work = Path(tempfile.mkdtemp(prefix=".sync-cpu-", dir=REPO / "bench"))
    try:
        tree = work / "tree"
        make_tree(tree)
        hosts = addresses(n)
        sync = MH + ["sync", "--hostfile", str(hostfile(work, n, "/root/synced")), "--code",
                     str(tree), "--plain"]
        rsync = " ".join(f"rsync -a {tree}/ {h}:/root/rsync-tree/ &" for h in hosts)
        measured(parallel_ssh(hosts, "rm -rf /root/synced /root/rsync-tree"))
        measured(sync)  # warm-up: the helper installed
        for run in range(runs):
            measured(parallel_ssh(hosts, "rm -rf /root/synced /root/rsync-tree"))
            mine = profile(f"multihost first sync, {n} hosts", sync, work, namespaces)
            theirs = profile(f"parallel rsync -a, {n} hosts", ["sh", "-c", f"{rsync} wait"], work,
                             namespaces)
            print(f"ratio {mine / theirs:.2f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lab", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args.hosts, args.runs, args.lab)
        return 0
    if shutil.which("perf") is None:
        raise SystemExit("bench: perf is not installed")
    with bench_lab(max(args.hosts, 8)) as lab:
        return reexec_inside(lab, os.path.abspath(__file__),
                             ["--hosts", str(args.hosts), "--runs", str(args.runs),
                              "--lab", lab.name])


if __name__ == "__main__":
    sys.exit(main())
