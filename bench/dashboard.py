"""The dashboard at 64 hosts x 8 ranks: its CPU while 512 ranks write flat out.

    python bench/dashboard.py                 # 10 s, blocks of 64 lines per rank
    python bench/dashboard.py --svg docs/dashboard-64.svg   # also save a screenshot

No lab: the events a run's log followers emit (a block of lines per rank, as each read
returns them) are fed to the dashboard's model as fast as this process can, from one
thread, while the dashboard draws at its own 4 frames a second from another, to a
terminal of 160 x 50 that is thrown away. Prints the lines applied per second and the
CPU seconds per wall second, all of it and the drawing's share. Goal: the dashboard stays
readable (64 hosts fold into a few rows) and responsive (a frame costs milliseconds) while
the lines flow; the log followers' own cost is bench/logs.py's.
"""
from __future__ import annotations

import argparse
import io
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402

from multihost.events import LogBlock, NodeChanged, NodeState, RunStarted  # noqa: E402
from multihost.views.board import BoardModel  # noqa: E402
from multihost.views.dashboard import render  # noqa: E402

HOSTS = tuple(f"198.18.0.{10 + i}" for i in range(1, 65))
RANKS = 8
FPS = 4


def block(node: int, local: int, step: int, lines: int) -> LogBlock:
    rank = node * RANKS + local
    text = "\n".join(f"epoch: 1, step: {step + k}, train_loss: {1 / (step + k + 1):.4f}, "
                     f"speed: {900 + rank % 50}.0 samples/s" for k in range(lines))
    return LogBlock(node, HOSTS[node], local, rank, text, time.time())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lines", type=int, default=64, help="lines per block")
    parser.add_argument("--by-rank", action="store_true")
    parser.add_argument("--svg", help="save a screenshot of the last frame here")
    args = parser.parse_args()

    model = BoardModel(by_rank=args.by_rank)
    model.apply(RunStarted("20261122-120000-d64a", HOSTS, RANKS, "train.py --epochs 3", time.time()))
    for node, host in enumerate(HOSTS):
        model.apply(NodeChanged(node, host, NodeState.RUNNING, time=time.time()))
    model.apply(NodeChanged(41, HOSTS[41], NodeState.LOST, detail="no answer for 15s",
                            time=time.time()))
    stop = threading.Event()
    drawing = {"cpu": 0.0, "frames": 0, "worst": 0.0}

    def draw() -> None:
        console = Console(file=io.StringIO(), width=160, height=50, color_system="truecolor",
                          force_terminal=True)
        while not stop.wait(1 / FPS):
            started = time.thread_time()
            console.file = io.StringIO()
            console.print(render(model.snapshot()))
            spent = time.thread_time() - started
            drawing["cpu"] += spent
            drawing["frames"] += 1
            drawing["worst"] = max(drawing["worst"], spent)

    drawer = threading.Thread(target=draw)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    drawer.start()
    applied, step = 0, 0
    try:
        while time.perf_counter() - wall0 < args.seconds:
            for node in range(len(HOSTS)):
                if node == 41:
                    continue   # the lost host says nothing more
                for local in range(RANKS):
                    model.apply(block(node, local, step, args.lines))
                    applied += args.lines
            step += args.lines
    finally:
        stop.set()
        drawer.join()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print(f"dashboard, 64 hosts x {RANKS} ranks, {'rows by rank' if args.by_rank else 'rows by host'}: "
          f"{applied / wall:,.0f} lines/s applied in blocks of {args.lines}, "
          f"{cpu / wall:.2f} CPU s per s in all (making the lines included)")
    print(f"drawing: {drawing['frames']} frames at {FPS}/s, {drawing['cpu'] / max(1, drawing['frames']) * 1000:.1f} ms "
          f"each on average, worst {drawing['worst'] * 1000:.1f} ms; "
          f"{drawing['cpu'] / wall:.3f} CPU s per s")
    print("one process on this machine (2 cores shared with other work): the CPU per frame "
          "is the figure to read")
    if args.svg:
        console = Console(record=True, width=160, file=io.StringIO(), force_terminal=True)
        console.print(render(model.snapshot()))
        console.save_svg(args.svg, title="multihost run: 64 hosts x 8 ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
