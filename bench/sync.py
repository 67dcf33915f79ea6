"""Benchmark: `multihost sync` against `rsync -a` over ssh to every host in parallel (the
anchor), in one run, on a lab of 4 hosts (--hosts N: 1-64) whose links are shaped to
1 Gbit/s.

    sudo python bench/sync.py              # its own lab, torn down at the end
    sudo python bench/sync.py --runs 5

Three measurements, each the whole command as a user runs it (a fresh process, timed
inside the lab's controller namespace), interleaved with the anchor and alternating
which goes first:
  first     2,000 small files (1-16 KB) and one 200 MB file to 4 empty workdirs
  nochange  the same again, nothing changed
  onefile   one small file changed
Goals (issue 4): first <= 1.0x rsync, nochange <= 0.5x, onefile <= 1.0x.

The fair fight (issue 12): the small cases again, against rsync given the reuse multihost
has (an OpenSSH ControlMaster per host, warmed before the runs, `rsync -e 'ssh -o
ControlMaster=auto -o ControlPath=... -o ControlPersist=600'`), multihost as a user gets
it running `multihost sync` again (the masters its last sync left). Goal: <= 1.0x.
For reference (no goal): multihost with connection reuse off (MULTIHOST_CONTROL_PERSIST=0:
paramiko and a full handshake per host).

Each figure: the median wall time, the controller's CPU seconds (the command and every
process it waited for: ssh clients, rsync) and its largest process's peak memory. All
lab hosts share this machine's cores (2 here): read the ratios and the controller's CPU.

multihost is timed as a user has it after `pip install multihost` (bench/_install.py:
a wheel of this tree in a venv of its own, made once); `--fair` also times the working
tree through the editable install (`pip install -e`), which pays about 30 ms more at
start-up.

    sudo python bench/sync.py --fair --runs 12   # the fair fight alone: 2,000 small
                                                 # files, no 200 MB file, no first sync timed
    sudo python bench/sync.py --fair --hosts 64  # the same at 64 hosts: rsync pays an rsync
                                                 # and an ssh client per host, multihost
                                                 # its start-up once

The controller's own link is shaped to 1 Gbit/s too (a tbf on the lab bridge, for
traffic the controller sends): a controller has one network port, which every host's
copy crosses when files go from the controller to each host directly.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _install import installed_multihost  # noqa: E402
from _lab import bench_lab, measured, reexec_inside  # noqa: E402

HOSTS = 4            # the default; --hosts N (1-64, what a lab holds)
RATE = "1gbit"
SMALL_FILES = 2000
BIG_FILE = 200 * 1000 * 1000
GOALS = {"first": 1.0, "nochange": 0.5, "onefile": 1.0}
FAIR_GOAL = 1.0      # the small cases against rsync through its own ControlMaster


def shape_uplink(lab) -> str:
    """A tbf on the bridge shapes what the controller sends (host-to-host traffic is
    switched between ports and does not pass it)."""
    from multihost.lab.config import BRIDGE, ctl_netns, parse_rate

    _, burst = parse_rate(RATE)
    ns = ctl_netns(lab.name)
    shown = subprocess.run(["tc", "-n", ns, "-j", "qdisc", "show", "dev", BRIDGE],
                           capture_output=True, text=True, check=True).stdout
    if any(q.get("kind") == "tbf" for q in json.loads(shown or "[]")):
        return "shaped by the lab"
    subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", BRIDGE, "root", "tbf", "rate", RATE,
                    "burst", str(burst), "latency", "50ms"], check=True)
    return "shaped by this benchmark"


def make_tree(root: Path, big: bool = True) -> None:
    rng = random.Random(4)
    for i in range(SMALL_FILES):
        path = root / f"pkg{i % 40}" / f"sub{i % 7}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1024, 16 * 1024)))
    with open(root / "weights.bin", "wb") as handle:
        for _ in range(BIG_FILE // (1 << 20) if big else 0):
            handle.write(os.urandom(1 << 20))
        handle.write(os.urandom(BIG_FILE % (1 << 20) if big else 1000))
    old = time.time() - 3600   # a checkout that is not brand new
    for dirpath, _, names in os.walk(root):
        for name in names:
            os.utime(os.path.join(dirpath, name), (old, old))


# As on a user's machine, Python may cache bytecode (some CI images forbid it, which
# would make every multihost command compile itself from source), and nothing on
# PYTHONPATH stands in front of the installed package.
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
# The working tree through the editable install, for comparison (--fair).
EDITABLE = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}


def run_timed(argv, env=None) -> list:
    """[wall s, controller CPU s, peak MiB] of one whole command."""
    done = measured([str(a) for a in argv], env={**ENV, **(env or {})})
    return [round(done.wall, 4), round(done.cpu, 4), round(done.peak_mib, 1)]


def rsync_all(addresses, code: Path, workdir: str, ssh: str = ""):
    shell = f"-e {shlex.quote(ssh)} " if ssh else ""
    targets = " ".join(f"rsync -a {shell}{code}/ {a}:{workdir}/ &" for a in addresses)
    return ["sh", "-c", f"{targets} wait"]


def reused_ssh(scratch: Path, addresses) -> str:
    """`ssh` through a ControlMaster per host, as multihost's quick path has; warmed."""
    sockets = scratch / "ssh"
    sockets.mkdir(mode=0o700)
    ssh = (f"ssh -o ControlMaster=auto -o ControlPersist=600 "
           f"-o ControlPath={sockets}/%C")
    for address in addresses:
        subprocess.run(shlex.split(ssh) + [address, "true"], check=True)
    return ssh


def multihost_sync(addresses, code: Path, workdir: str, script: str = ""):
    """The `multihost` script of the regular install (``script``), else the working
    tree through this Python (the editable install)."""
    command = [script] if script else [sys.executable, "-m", "multihost"]
    return command + ["sync", "--ips", ",".join(addresses), "--code", str(code),
                      "--workdir", workdir, "--plain"]


REFERENCE = ("multihost, no reuse", "rsync, reused ssh")


def inside(runs: int, addresses, script: str) -> dict:
    """Runs as the lab's controller. Returns {measurement: {tool: [seconds]}}."""
    times = {m: {"multihost": [], "rsync": []} for m in GOALS}
    for name in ("nochange", "onefile"):
        times[name].update({tool: [] for tool in REFERENCE})
    scratch = Path(tempfile.mkdtemp(prefix="mhbench-"))
    try:
        code = scratch / "code"
        make_tree(code)
        warm = scratch / "warm"
        warm.mkdir()
        (warm / "x").write_text("x")
        run_timed(multihost_sync(addresses, warm, "/root/bench-warm", script))  # the helper
        ssh = reused_ssh(scratch, addresses)
        cache = Path.home() / ".cache" / "multihost" / "hashes"
        for run in range(runs):
            mine, theirs = f"/root/bench-mh{run}", f"/root/bench-rs{run}"
            order = ["multihost", "rsync"] if run % 2 == 0 else ["rsync", "multihost"]
            commands = {"multihost": multihost_sync(addresses, code, mine, script),
                        "rsync": rsync_all(addresses, code, theirs)}
            shutil.rmtree(cache, ignore_errors=True)   # a first sync hashes from scratch
            for measurement in ("first", "nochange", "onefile"):
                if measurement == "onefile":
                    change(code, f"run {run}")
                for tool in order:
                    times[measurement][tool].append(run_timed(commands[tool]))
            # For reference, on the same trees (in sync again by now): one more change
            # each, then nothing.
            reference = {"multihost, no reuse": (multihost_sync(addresses, code, mine, script),
                                                 {"MULTIHOST_CONTROL_PERSIST": "0"}),
                         "rsync, reused ssh": (rsync_all(addresses, code, theirs, ssh), {})}
            change(code, f"reference {run}")
            for tool, (argv, env) in reference.items():
                times["onefile"][tool].append(run_timed(argv, env))
            for tool, (argv, env) in reference.items():
                times["nochange"][tool].append(run_timed(argv, env))
            print(f"bench: run {run + 1}/{runs} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return times


FAIR = ("multihost", "multihost, editable", "rsync, reused ssh")


def inside_fair(runs: int, addresses, script: str) -> dict:
    """The fair fight alone, as the lab's controller: the installed multihost, the
    editable one and rsync through its ControlMaster, each from a copy of the tree of
    its own (a multihost's hash cache and records are per tree: one variant must not
    hash for the other) to a workdir of its own that a first (untimed) sync filled. Per
    run, the order turning: each tool finds nothing to do; then one file is changed in
    every copy at once and each tool syncs it. Returns {measurement: {tool: [samples]}}."""
    times = {m: {tool: [] for tool in FAIR} for m in ("nochange", "onefile")}
    scratch = Path(tempfile.mkdtemp(prefix="mhbench-"))
    try:
        trees = {tool: scratch / f"code{i}" for i, tool in enumerate(FAIR)}
        for tree in trees.values():
            make_tree(tree, big=False)
        ssh = reused_ssh(scratch, addresses)
        commands = {
            "multihost": (multihost_sync(addresses, trees["multihost"], "/root/fair-mh", script),
                          {}),
            "multihost, editable": (multihost_sync(addresses, trees["multihost, editable"],
                                                   "/root/fair-mhe"), EDITABLE),
            "rsync, reused ssh": (rsync_all(addresses, trees["rsync, reused ssh"],
                                            "/root/fair-rs", ssh), {})}
        for argv, env in commands.values():   # the first sync, and the masters it leaves
            run_timed(argv, env)
        for run in range(runs):
            order = FAIR[run % len(FAIR):] + FAIR[:run % len(FAIR)]
            for tool in order:
                times["nochange"][tool].append(run_timed(*commands[tool]))
            for tree in trees.values():
                change(tree, f"run {run}")
            for tool in order:
                times["onefile"][tool].append(run_timed(*commands[tool]))
            print(f"bench: run {run + 1}/{runs} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return times


def report_fair(times: dict, hosts: int) -> int:
    header = f"{'':<11}{'wall':>10}{'cpu':>8}{'peak':>7}{'wall':>10}{'cpu':>8}{'peak':>7}{'ratio':>7}"
    print(f"sync to {hosts} hosts, {SMALL_FILES} files of 1-16 KB; both reuse connections; "
          f"load average {os.getloadavg()[0]:.1f}")
    missed = 0
    for tool, what in (("multihost", "regular install (a wheel)"),
                       ("multihost, editable", "the working tree, editable install")):
        print(f"{tool}: {what}\n{'':<11}{tool:>25}{'rsync, ControlMaster':>25}\n{header}")
        for name in ("nochange", "onefile"):
            met = line(name, times[name][tool], times[name]["rsync, reused ssh"], FAIR_GOAL)
            missed += tool == "multihost" and not met
    runs = len(times["nochange"]["multihost"])
    print(f"(medians of {runs} runs, interleaved; all [wall, cpu, peak MiB]: {json.dumps(times)})")
    return 1 if missed else 0


def change(code: Path, text: str) -> None:
    with open(code / "pkg3" / "sub3" / "mod3.py", "ab") as handle:
        handle.write(f"# {text}\n".encode())


def med(samples, index: int = 0) -> float:
    return statistics.median(sample[index] for sample in samples)


def line(name: str, mine: list, theirs: list, goal: float = 0.0) -> bool:
    ratio = med(mine) / med(theirs)
    met = not goal or ratio <= goal
    print(f"{name:<11}{med(mine):>9.3f}s{med(mine, 1):>7.3f}s{med(mine, 2):>6.0f}M"
          f"{med(theirs):>9.3f}s{med(theirs, 1):>7.3f}s{med(theirs, 2):>6.0f}M{ratio:>7.2f}"
          + (f"   <= {goal:.1f}: {'met' if met else 'MISSED'}" if goal else ""))
    return met


def report(times: dict, uplink: str, hosts: int) -> int:
    print(f"sync to {hosts} hosts, links {RATE} (controller uplink {uplink}): "
          f"{SMALL_FILES} files of 1-16 KB + 1 file of {BIG_FILE // 10**6} MB")
    print("medians: wall, controller CPU (the command and what it waited for), peak memory; "
          "all lab hosts share this machine's cores, so the ratios and CPU are the figures")
    header = f"{'':<11}{'wall':>10}{'cpu':>8}{'peak':>7}{'wall':>10}{'cpu':>8}{'peak':>7}{'ratio':>7}"
    missed = 0
    print(f"{'':<11}{'multihost':>25}{'rsync -a':>25}\n{header}")
    for name, goal in GOALS.items():
        missed += not line(name, times[name]["multihost"], times[name]["rsync"], goal)
    print(f"fair fight: both reuse connections\n{'':<11}{'multihost':>25}"
          f"{'rsync, ControlMaster':>25}\n{header}")
    for name in ("nochange", "onefile"):
        missed += not line(name, times[name]["multihost"], times[name]["rsync, reused ssh"],
                           FAIR_GOAL)
    print(f"for reference (no goal): multihost with reuse off\n{'':<11}"
          f"{'multihost, no reuse':>25}{'rsync, ControlMaster':>25}\n{header}")
    for name in ("nochange", "onefile"):
        line(name, times[name]["multihost, no reuse"], times[name]["rsync, reused ssh"])
    runs = len(times["first"]["rsync"])
    print(f"(medians of {runs} runs; all [wall, cpu, peak MiB]: {json.dumps(times)})")
    return 1 if missed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--hosts", type=int, default=HOSTS, choices=range(1, 65),
                        metavar="N", help=f"lab hosts, 1-64 (default {HOSTS})")
    parser.add_argument("--fair", action="store_true",
                        help="only the small cases against rsync through its ControlMaster")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--script", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        from multihost.lab import host_address

        measure = inside_fair if args.fair else inside
        times = measure(args.runs, [host_address(i) for i in range(1, args.hosts + 1)], args.script)
        Path(args.out).write_text(json.dumps(times))
        return 0
    script = str(installed_multihost())
    with bench_lab(args.hosts, rate=RATE) as lab, tempfile.TemporaryDirectory() as tmp:
        uplink = shape_uplink(lab)
        out = os.path.join(tmp, "times.json")
        code = reexec_inside(lab, os.path.abspath(__file__), [
            "--runs", str(args.runs), "--hosts", str(args.hosts), "--out", out,
            "--script", script,
            *(["--fair"] if args.fair else [])])
        if code != 0:
            return code
        times = json.loads(Path(out).read_text())
    if args.fair:
        return report_fair(times, args.hosts)
    print("multihost: a regular install of this tree (a wheel, bench/_install.py)")
    return report(times, uplink, args.hosts)


if __name__ == "__main__":
    sys.exit(main())
