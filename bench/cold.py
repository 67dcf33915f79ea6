"""Speed as users feel it, cold: every command a fresh process, as typed at a prompt.

    sudo python bench/cold.py                         # 4 lab hosts, medians of 5
    sudo python bench/cold.py --hosts 4,64 --runs 3
    sudo python bench/cold.py --before REV            # the code at REV too, in the same run

Three measurements, the first two against what a user would otherwise do by hand, in the
same run:

  rerun   edit one line of a one-line script in a 2,000-file project, then
          `multihost run --launcher python -- train.py` until every rank has run (check,
          sync, launch, wait: the whole default command). Anchor: a hand-written loop,
          `rsync -a` to every host then `ssh host python train.py`, all hosts at once.
          Goal: at most 1.0x the loop. The run's controller CPU is printed too: it
          hardly moves with the machine's load, where the ratio does.
  cpu     controller CPU (the command and every process it waited for) of
          `multihost exec -- true` and `multihost check`, per host. Goal: at most 30 ms a
          host at 64 hosts.
  help    controller CPU of `multihost --help`, the floor every command pays. Goal: under
          0.15 s (the median of the runs).

`--before REV` runs the same commands with the code at REV (a git worktree, through
PYTHONPATH exactly as the working tree is run), interleaved with the current code, so both
meet the same machine load. Neither side keeps anything warm between commands but what
plain OpenSSH keeps (a ControlMaster, where the code uses one). All lab hosts share this
machine's cores: read the ratios, not the seconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lab import (REPO, addresses, bench_lab, hostfile, measured, reexec_inside,  # noqa: E402
                  remove_scratch)

SMALL_FILES = 2000
RERUN_GOAL = 1.0
CPU_GOAL_MS = 30.0
HELP_GOAL_S = 0.15
WORKDIR = "/root/mh-cold"        # each lab host's own home: private per host
HAND_WORKDIR = "/root/hand-cold"


def make_project(root: Path) -> None:
    """A project of 2,000 small files, as a real training repository has, and a script."""
    import random

    rng = random.Random(4)
    for i in range(SMALL_FILES):
        path = root / f"pkg{i % 40}" / f"sub{i % 7}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1024, 16 * 1024)))
    edit(root, 0)


def edit(root: Path, round_: int) -> None:
    (root / "train.py").write_text(f"print('ran', {round_})\n")


def multihost(*args: str):
    return [sys.executable, "-m", "multihost", *args]


def hand_loop(hosts, code: Path):
    """What a user writes by hand: copy, then run, on every host at once."""
    each = " ".join(
        f"(rsync -a {code}/ {h}:{HAND_WORKDIR}/ && ssh -o BatchMode=yes {h} "
        f"'cd {HAND_WORKDIR} && {sys.executable} train.py' >/dev/null) &" for h in hosts)
    return ["sh", "-c", f"{each} wait"]


def versions(scratch: Path, before: str) -> dict:
    """Each code under test, as the environment its commands run with."""
    # An installed multihost has its bytecode compiled: a shell that asks Python not to
    # write any would have every command compile every module it imports (0.15 s of CPU).
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    # The code before had a warm controller; cold means without it.
    base["MULTIHOST_WARM"] = "0"
    found = {"now": dict(base, PYTHONPATH=str(REPO))}
    if before:
        tree = scratch / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree),
                        before], check=True)
        found["before"] = dict(base, PYTHONPATH=str(tree))
    return found


def help_cpu(codes: dict, runs: int, scratch: Path) -> int:
    """`multihost --help`'s CPU for each code, interleaved; 1 when the current one misses."""
    cpu = {name: [] for name in codes}
    for _ in range(runs):
        for name, env in codes.items():
            cpu[name].append(measured(multihost("--help"), env=env, cwd=scratch).cpu)
    print(f"\n`multihost --help`, medians of {runs}, every command a fresh process")
    for name in codes:
        took = statistics.median(cpu[name])
        flag = "" if took < HELP_GOAL_S else "  (goal missed)"
        print(f"  {name:>8}: controller CPU {took:5.3f} s (goal: < {HELP_GOAL_S:g}){flag}")
    return int(statistics.median(cpu["now"]) >= HELP_GOAL_S)


def inside(args) -> int:
    scratch = Path(tempfile.mkdtemp(prefix=".cold-", dir=REPO / "bench"))
    code = scratch / "code"
    make_project(code)
    missed = 0
    try:
        codes = versions(scratch, args.before)
        missed += help_cpu(codes, args.runs, scratch)
        for n in args.hosts:
            hosts, hosts_file = addresses(n), str(hostfile(scratch, n, WORKDIR))
            run = ["run", "--hostfile", hosts_file, "--code", str(code), "--launcher", "python",
                   "--plain", "--", "train.py"]
            times = {name: [] for name in [*codes, "hand"]}
            cpu = {(name, cmd): [] for name in codes for cmd in ("run", "exec", "check")}
            for round_ in range(args.runs + 1):        # the first round warms the page cache
                for name, env in codes.items():
                    edit(code, round_)
                    done = measured(multihost(*run), env=env, cwd=scratch)
                    if round_:
                        times[name].append(done.wall)
                        cpu[(name, "run")].append(done.cpu)
                    for cmd, extra in (("exec", ["exec", "--", "true"]), ("check", ["check"])):
                        done = measured(multihost(extra[0], "--hostfile", hosts_file,
                                                  *extra[1:]), env=env, cwd=scratch)
                        if round_:
                            cpu[(name, cmd)].append(done.cpu)
                edit(code, round_)
                took = measured(hand_loop(hosts, code)).wall
                if round_:
                    times["hand"].append(took)
            hand = statistics.median(times["hand"])
            print(f"\n{n} hosts, medians of {args.runs}, every command a fresh process")
            print(f"  edit one line, run again   hand loop (rsync + ssh) {hand:6.2f} s")
            for name in codes:
                mine = statistics.median(times[name])
                flag = "" if mine / hand <= RERUN_GOAL else "  (goal missed)"
                missed += name == "now" and mine / hand > RERUN_GOAL
                print(f"  {name:>8}: multihost run {mine:6.2f} s = {mine / hand:4.2f}x{flag}")
            for name in codes:   # the CPU a command costs hardly moves with the load
                print(f"  {name:>8}: run   controller CPU "
                      f"{statistics.median(cpu[(name, 'run')]):6.2f} s")
            for name in codes:
                for cmd in ("exec", "check"):
                    per_host = statistics.median(cpu[(name, cmd)]) * 1000 / n
                    print(f"  {name:>8}: {cmd:<5} controller CPU {per_host:6.1f} ms a host "
                          f"(goal at 64 hosts: <= {CPU_GOAL_MS:g})")
    finally:
        if args.before:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(scratch / "before")], check=False)
        remove_scratch(scratch)
    return 1 if missed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="4", help="lab sizes, comma-separated (1-64)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", default="", metavar="REV",
                        help="also run the code at this git revision, interleaved")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.hosts = [int(n) for n in str(args.hosts).split(",")]
    if args.inside:
        return inside(args)
    forwarded = ["--hosts", ",".join(map(str, args.hosts)), "--runs", str(args.runs)]
    if args.before:
        forwarded += ["--before", args.before]
    with bench_lab(max(args.hosts)) as lab:
        return reexec_inside(lab, __file__, forwarded)


if __name__ == "__main__":
    sys.exit(main())
