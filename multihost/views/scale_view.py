"""How a scaling table looks: a rich table on a terminal (aligned text in a pipe),
markdown for a README or an issue, JSON for a script, and a text bar chart of throughput
against linear scaling. Rendering only: the numbers are computed in multihost/scale/."""
from __future__ import annotations

import json
from typing import IO, List, Optional, Tuple

HEADERS = ("machines", "processes per machine", "throughput", "speed-up", "efficiency", "run")
BLOCKS = " ▏▎▍▌▋▊▉█"     # eighths of a character cell
CHART_WIDTH = 40


def _speedup(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _throughput(value: float) -> str:
    return f"{value:.1f}" if value < 1e6 else f"{value:.4g}"


def cells(table) -> List[Tuple[str, ...]]:
    """One row of text per point, in the order of HEADERS."""
    return [(str(r.point.machines), str(r.point.nproc_per_node), _throughput(r.point.throughput),
             _speedup(r.speedup), _percent(r.efficiency), r.point.run_id) for r in table.rows()]


def notes(table) -> List[str]:
    """What the figures are: the metric, the rule that combined ranks, the baseline."""
    base = table.baseline
    rules = sorted({p.rule for p in table.points})
    lines = [f"throughput: {table.metric}, the median after warm-up; ranks combined: "
             f"{', '.join(rules) or '-'} (docs/scale.md)"]
    if base is not None:
        lines.append(f"speed-up over {base.machines} machine(s); efficiency = speed-up / "
                     f"(machines / {base.machines})")
    return lines


def markdown(table) -> str:
    head = "| " + " | ".join(HEADERS) + " |"
    rule = "|" + "|".join("---:" if i < 5 else "---" for i in range(len(HEADERS))) + "|"
    body = ["| " + " | ".join(row) + " |" for row in cells(table)]
    return "\n".join([head, rule] + body) + "\n"


def to_json(table) -> str:
    return json.dumps(table.to_json(), indent=2) + "\n"


def _bar(fraction: float, width: int) -> str:
    eighths = max(0, round(fraction * width * 8))
    full, part = divmod(min(eighths, width * 8), 8)
    return "█" * full + (BLOCKS[part] if part else "")


def text_chart(table, width: int = CHART_WIDTH) -> str:
    """Throughput by machine count as bars; ``|`` marks linear scaling from the baseline,
    so the gap between a bar's end and its mark is what scaling lost."""
    rows = table.rows()
    base = table.baseline
    if not rows or base is None:
        return ""
    ideal = {r.point.machines: base.throughput * r.point.machines / base.machines for r in rows}
    top = max([r.point.throughput for r in rows] + list(ideal.values())) or 1.0
    label = max(len(f"{r.point.machines} machines") for r in rows)
    lines = [f"throughput by machines (| = linear scaling from {base.machines})"]
    for r in rows:
        bar = list(_bar(r.point.throughput / top, width).ljust(width))
        mark = min(width - 1, max(0, round(ideal[r.point.machines] / top * width) - 1))
        if bar[mark] == " ":
            bar[mark] = "|"
        name = f"{r.point.machines} machine" + ("s" if r.point.machines != 1 else "")
        lines.append(f"{name:<{label}}  {''.join(bar)}  {_throughput(r.point.throughput):>10}"
                     f"  {_speedup(r.speedup):>5}x  {_percent(r.efficiency):>4}")
    return "\n".join(lines) + "\n"


def render_plain(table, out: IO[str]) -> None:
    rows = [HEADERS] + cells(table)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    for row in rows:
        out.write("  ".join(c.rjust(w) if i < 5 else c for i, (c, w)
                            in enumerate(zip(row, widths))).rstrip() + "\n")
    for line in notes(table):
        out.write(line + "\n")


def render_rich(table, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    grid = Table(*HEADERS, title="scaling: " + table.command)
    for column in grid.columns[:5]:
        column.justify = "right"
    for row in cells(table):
        grid.add_row(*row)
    console.print(grid)
    for line in notes(table):
        console.print(line, highlight=False)


def render(table, out: IO[str], mode: str = "auto") -> None:
    """``auto`` (rich on a terminal, aligned text in a pipe) with the text chart below it,
    ``markdown``, or ``json``."""
    from .terminal import wants_plain

    if mode == "json":
        out.write(to_json(table))
        return
    if mode == "markdown":
        out.write(markdown(table))
        return
    if wants_plain(out):
        render_plain(table, out)
    else:
        from rich.console import Console

        render_rich(table, Console(file=out))
    out.write("\n" + text_chart(table))
