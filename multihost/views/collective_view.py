"""How ``check --collective`` looks, after the check's own table: the bandwidth of every
size as nccl-tests prints it, the latency of small messages, the host-to-host matrix with
the interface each pair used, and the findings (one line each, with the fix). Plain text
and rich draw the same rows; JSON is ``collective_to_json``.
"""
from __future__ import annotations

from typing import IO, List, Optional

from ..check.collective import CollectiveReport, human_size

MATRIX_LIMIT = 16   # larger clusters list each host's median instead of the matrix


def _gbps(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.4f}" if bytes_per_s < 1e9 else f"{bytes_per_s / 1e9:.2f}"


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 0.001 else f"{seconds * 1e3:.1f} ms"


def size_rows(report: CollectiveReport) -> List[List[str]]:
    run = report.collective
    if run is None:
        return []
    header = ["op", "size", "time", "algbw GB/s", "busbw GB/s", "iters"]
    return [header] + [[r.op, human_size(r.bytes), _time(r.seconds), _gbps(r.algbw),
                        _gbps(r.busbw), str(r.iters)] for r in run.rows]


def matrix_rows(report: CollectiveReport) -> List[List[str]]:
    """From (row) to (column), Mbit/s; the last column: the host's median."""
    links = report.links
    if links is None or len(links.labels) > MATRIX_LIMIT:
        return []
    n = len(links.labels)
    rows = [["from \\ to"] + [str(j) for j in range(n)] + ["median"]]
    for i, label in enumerate(links.labels):
        cells = ["." if i == j else "?" if v is None else f"{v / 1e6:.0f}"
                 for j, v in enumerate(links.rates[i])]
        median = links.host_median(i)
        rows.append([f"{i} {label}"] + cells + ["?" if median is None else f"{median / 1e6:.0f}"])
    return rows


def iface_line(report: CollectiveReport) -> Optional[str]:
    links = report.links
    if links is None:
        return None
    used = {}
    for i, row in enumerate(links.ifaces):
        for j, name in enumerate(row):
            if i != j and name:
                used.setdefault(name, []).append(f"{i}->{j}")
    if not used:
        return None
    if len(used) == 1:
        return f"interface: {next(iter(used))} on every pair"
    return "interfaces: " + "; ".join(f"{name} on {', '.join(pairs[:12])}"
                                      for name, pairs in sorted(used.items()))


def summary_lines(report: CollectiveReport) -> List[str]:
    """Latency, stops, errors and the verdict: the lines below the tables."""
    if report.skipped:
        return [f"collective: skipped: {report.skipped}"]
    lines = []
    run = report.collective
    if run is not None and run.error:
        lines.append(f"FAIL collective job: {run.error}")
    elif run is not None:
        latencies = [f"{op} {human_size(row.bytes)} {_time(row.seconds)}"
                     for op in ("all_reduce", "all_gather") for row in [run.latency(op)] if row]
        if latencies:
            lines.append("small-message latency: " + ", ".join(latencies))
        for op, size in run.capped:
            lines.append(f"{op} stopped growing after {human_size(size)} (one size took over "
                         "2 s; --collective-sizes picks the sizes)")
    links = report.links
    for error in (links.errors if links else ())[:8]:
        lines.append(f"WARN link test: {error}")
    for finding in report.findings:
        lines.append(f"SLOW {finding.line}")
        lines.append(f"     fix: {finding.fix}")
    if links is not None and not report.findings:
        lines.append("links: no finding (every host within 70% of the median)")
    spent = f"links {report.link_duration:.1f}s"
    if run is not None and run.timings:
        spent += ", job " + ", ".join(f"{name} {value:.1f}s" for name, value in run.timings)
    if report.measured_twice:
        spent += ", measured twice"
    state = "FAILED" if not report.ok else "done" if report.ready else \
        f"NOT ready: {len(report.findings)} slow"
    lines.append(f"collective: {state} ({report.duration:.1f}s: {spent})")
    return lines


def head_line(report: CollectiveReport) -> Optional[str]:
    run = report.collective
    if run is None or run.error:
        return None
    return (f"collective: {run.backend}, {run.ranks} ranks, torch {run.torch}; "
            "busbw = algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather)")


def _table(rows: List[List[str]]) -> List[str]:
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    return ["  ".join(text.rjust(w) if k else text.ljust(w)
                      for k, (text, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


def render_plain(report: CollectiveReport, out: IO[str]) -> None:
    parts: List[str] = []
    head = head_line(report)
    if head:
        parts += ["", head] + _table(size_rows(report))
    matrix = matrix_rows(report)
    if matrix:
        parts += ["", "links, Mbit/s from (row) to (column):"] + _table(matrix)
    line = iface_line(report)
    if line:
        parts.append(line)
    parts += [""] + summary_lines(report)
    out.write("\n".join(parts) + "\n")
    out.flush()


def render_rich(report: CollectiveReport, console) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    for title, rows in ((head_line(report), size_rows(report)),
                        ("links, Mbit/s from (row) to (column)", matrix_rows(report))):
        if not rows or not title:
            continue
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                      header_style="bold")
        for k, name in enumerate(rows[0]):
            table.add_column(name, justify="left" if k == 0 else "right", no_wrap=True)
        for row in rows[1:]:
            table.add_row(*row)
        console.print(table)
    line = iface_line(report)
    if line:
        console.print(line, markup=False, highlight=False)
    for text in summary_lines(report):
        style = "bold red" if text.startswith(("SLOW", "FAIL", "collective: FAILED",
                                               "collective: NOT ready")) else \
            "yellow" if text.startswith("WARN") else "cyan" if text.startswith("     fix") else \
            "bold green" if text.startswith("collective: done") else ""
        console.print(Text(text, style=style))
