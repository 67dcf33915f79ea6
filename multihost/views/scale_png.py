"""The scaling chart as a PNG: throughput bars by machine count, the line of linear
scaling from the baseline, and each point's speed-up and efficiency written on its bar.
matplotlib (the ``chart`` extra) draws it, off-screen (Agg): no display is needed."""
from __future__ import annotations

import os

from ..errors import ConfigError

FIX = "pip install 'multihost[chart]' (matplotlib), or leave the chart out with --no-png"


def have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def check_png_path(path: str) -> None:
    """The chart's path must be writable and matplotlib there, known before any run."""
    if not have_matplotlib():
        raise ConfigError("the PNG chart needs matplotlib, which is not installed", fix=FIX)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise ConfigError(f"--png {path}: {parent} is not a directory this user can write",
                          fix="give a path in a writable directory, e.g. --png scale.png")


def write_png(table, path: str) -> str:
    """Write the chart to ``path`` (atomically: a reader never sees half a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = table.rows()
    base = table.baseline
    machines = [r.point.machines for r in rows]
    figure = Figure(figsize=(6.4, 4.0), dpi=100)
    axes = figure.subplots()
    axes.bar(machines, [r.point.throughput for r in rows], width=0.6, color="#4c72b0",
             label="measured")
    if base is not None:
        axes.plot(machines, [base.throughput * m / base.machines for m in machines], "--",
                  color="#dd8452", marker="o", label=f"linear from {base.machines}")
    for r in rows:
        if r.speedup is not None:
            axes.annotate(f"{r.speedup:.2f}x\n{r.efficiency * 100:.0f}%",
                          (r.point.machines, r.point.throughput), ha="center", va="bottom",
                          fontsize=8, xytext=(0, 2), textcoords="offset points")
    axes.set_xticks(machines)
    axes.set_xlabel(f"machines ({rows[0].point.nproc_per_node} process(es) each)" if rows
                    else "machines")
    axes.set_ylabel("throughput")
    axes.set_title(f"scaling: {table.command}"[:80], fontsize=10)
    axes.margins(y=0.15)
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    tmp = f"{path}.tmp-{os.getpid()}"
    figure.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path
