"""Benchmark: a no-change and a one-file sync as a user feels them, cold, at 4 hosts.

    sudo python bench/sync_cold.py            # its own lab, torn down at the end
    sudo python bench/sync_cold.py --runs 7 --hosts 4

Cold: every command a fresh process, no OpenSSH master on either side
(MULTIHOST_CONTROL_PERSIST=0), no warm process of any kind. The anchor, in the same run:
a fresh parallel `rsync -a` to every host. Each tool syncs a copy of the tree of its own
(2,000 files of 1-16 KB) to a workdir of its own that a first, untimed sync filled; per
run, in turning order, each finds nothing to do, then one file is changed in every copy
and each syncs it. The figures: the median wall time of the whole command, timed
inside the lab's controller namespace, the median of its ratio to rsync's in the same
run, and the controller's CPU seconds.

``--variants`` adds multihost with parts of its sync turned off in that process only
(for deciding whether a part earns its code), named ``label=module:attr,...``: each
function named is replaced by one that does nothing and returns None. ``--before REV``
adds the code at git revision REV (a worktree, run through PYTHONPATH as this tree is,
without the warm controller it may have had), for a before-and-after in one run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lab import bench_lab, measured, reexec_inside  # noqa: E402
from sync import change, make_tree, rsync_all  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COLD = {"MULTIHOST_CONTROL_PERSIST": "0"}
# Run multihost's CLI after turning the named functions off (see --variants).
PATCHED = """\
import importlib, sys
for spec in filter(None, sys.argv.pop(1).split(",")):
    module, _, attr = spec.partition(":")
    setattr(importlib.import_module(module), attr, lambda *a, **k: None)
from multihost.cli import main
sys.exit(main())
"""


def multihost(addresses, code: Path, workdir: str, patches: str) -> list:
    return [sys.executable, "-c", PATCHED, patches, "sync", "--ips", ",".join(addresses),
            "--code", str(code), "--workdir", workdir, "--plain"]


def inside(runs: int, addresses, variants: dict, before: str = "") -> dict:
    tools = {"multihost": "", **variants}
    scratch = Path(tempfile.mkdtemp(prefix="mhcold-"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE",)}
    env.update(COLD, PYTHONPATH=str(REPO), MULTIHOST_WARM="0")
    envs = {}
    if before:
        tree = scratch / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree),
                        before], check=True)
        tools[f"multihost at {before}"] = ""
        envs[f"multihost at {before}"] = dict(env, PYTHONPATH=str(tree))
    try:
        trees = {tool: scratch / f"code{i}" for i, tool in enumerate([*tools, "rsync"])}
        for tree in trees.values():
            make_tree(tree, big=False)
        commands = {tool: multihost(addresses, trees[tool], f"/root/cold-{i}", patches)
                    for i, (tool, patches) in enumerate(tools.items())}
        commands["rsync"] = rsync_all(addresses, trees["rsync"], "/root/cold-rsync")
        for tool, argv in commands.items():   # the first sync, untimed
            measured(argv, env=envs.get(tool, env))
        names = list(commands)
        times = {m: {tool: [] for tool in names} for m in ("nochange", "onefile")}
        for run in range(runs):
            order = names[run % len(names):] + names[:run % len(names)]
            for tool in order:
                times["nochange"][tool].append(_sample(commands[tool], envs.get(tool, env)))
            for tree in trees.values():
                change(tree, f"run {run}")
            for tool in order:
                times["onefile"][tool].append(_sample(commands[tool], envs.get(tool, env)))
            print(f"bench: run {run + 1}/{runs} done", file=sys.stderr, flush=True)
    finally:
        if before:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(scratch / "before")], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    return times


def _sample(argv: list, env: dict) -> list:
    done = measured(argv, env=env)
    return [round(done.wall, 4), round(done.cpu, 4)]


def report(times: dict, hosts: int) -> None:
    """Per tool: its median wall time; the median of its ratio to rsync's time in the
    same run (the runs' neighbours share the machine's load of the moment: a ratio
    within a run is steadier than a ratio of medians on a shared machine); and the
    controller's CPU (the command and every process it waited for)."""
    print(f"cold sync to {hosts} hosts, 2,000 files of 1-16 KB; medians of "
          f"{len(times['nochange']['rsync'])} runs; ratio: to a fresh parallel rsync -a "
          "in the same run")
    for name, by_tool in times.items():
        for tool, samples in by_tool.items():
            ratios = [mine[0] / theirs[0] for mine, theirs in zip(samples, by_tool["rsync"])]
            print(f"{name:<9} {tool:<28} {statistics.median(s[0] for s in samples):7.3f}s "
                  f"{statistics.median(ratios):6.2f}x  cpu "
                  f"{statistics.median(s[1] for s in samples):6.3f}s")
    print("samples:", json.dumps(times))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hosts", type=int, default=4, choices=range(1, 65), metavar="N")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=PATCHES")
    parser.add_argument("--before", default="", metavar="REV",
                        help="also the code at this git revision, in the same run")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant)
    if args.inside:
        from multihost.lab import host_address

        times = inside(args.runs, [host_address(i) for i in range(1, args.hosts + 1)], variants,
                       args.before)
        Path(args.out).write_text(json.dumps(times))
        return 0
    with bench_lab(args.hosts) as lab, tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        code = reexec_inside(lab, os.path.abspath(__file__), [
            "--runs", str(args.runs), "--hosts", str(args.hosts), "--out", out,
            *[f"--variant={v}" for v in args.variant],
            *(["--before", args.before] if args.before else [])])
        if code != 0:
            return code
        report(json.loads(Path(out).read_text()), args.hosts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
