"""How a CheckReport looks (``CheckView``: what ``multihost check`` shows): a rich table
on a terminal, the same table as plain text in a pipe, or one JSON document. Hosts in
rank order are rows, checks are columns (in the checks' registered order); hosts whose
cells are all the same share one row; failures and warnings follow, each once with the
hosts it concerns and its fix; the N x N ping matrix when a pair did not answer.
"""
from __future__ import annotations

import contextlib
import json
import re
import shlex
import sys
from typing import IO, Dict, Iterator, List, Optional, Sequence, Tuple

from ..check.parsers import fold_ranges
from ..check.registry import checks
from ..check.report import FAIL, PASS, SKIP, WARN, CheckReport, CheckResult, HostReport
from ..events import CheckStage
from ..nodeset import fold
from .terminal import wants_plain

SYMBOL = {PASS: "✓", WARN: "!", FAIL: "✗", SKIP: "–"}
STYLE = {PASS: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}
PLAIN = {PASS: "", WARN: "WARN ", FAIL: "FAIL ", SKIP: ""}
MATRIX_LIMIT = 16   # larger clusters list the silent pairs instead of drawing the matrix

Row = Tuple[List[HostReport], Tuple[Tuple[str, str], ...]]


def columns(report: CheckReport) -> List[str]:
    """The checks some host has a result for, in the checks' order."""
    present = {r.name for h in report.hosts for r in h.results}
    return [c.name for c in checks() if c.name in present]


def short_headers() -> Dict[str, str]:
    """Headers of the compact table (symbols only), for terminals too narrow for the
    details: each check's short name."""
    return {c.name: c.header for c in checks()}


def cell(result: CheckResult) -> str:
    return "-" if result.status == SKIP else result.cell


def fold_rows(report: CheckReport) -> List[Row]:
    """Hosts with identical cells, in the order their first host appears. Only
    neighbours fold, so rows stay in rank order."""
    names = columns(report)
    rows: List[Row] = []
    for host in report.hosts:
        by_name = {r.name: r for r in host.results}
        cells = tuple((by_name[n].status, cell(by_name[n])) if n in by_name else (SKIP, "")
                      for n in names)
        if rows and rows[-1][1] == cells:
            rows[-1][0].append(host)
        else:
            rows.append(([host], cells))
    return rows


def row_labels(hosts: Sequence[HostReport]) -> Tuple[str, str]:
    return fold_ranges(h.host.rank for h in hosts), fold([h.host.label for h in hosts])


def findings(report: CheckReport) -> List[Tuple[str, str, str, str, List[str]]]:
    """(status, check, detail, fix, hosts) for every warn and fail, each once. Findings
    that differ only by the host they name ("10.0.0.5:22 is unreachable") are one, said
    with <host> in its place: ten dead hosts make one line, not ten."""
    grouped: Dict[Tuple[str, str, str, str], List[Tuple[str, str, str]]] = {}
    for status in (FAIL, WARN):
        for host, result in report.failures(status):
            names = [n for n in {host.host.label, host.host.name, host.address or ""} if n]
            generic = [_without(text, names) for text in (result.detail, result.fix or "")]
            key = (status, result.name, generic[0], generic[1])
            grouped.setdefault(key, []).append((host.host.label, result.detail, result.fix or ""))
    found = []
    for (status, name, detail, fix), members in grouped.items():
        labels = [label for label, _, _ in members]
        if len(members) == 1:
            detail, fix = members[0][1], members[0][2]
        else:
            # A fix's command on "that host" is, for the group, on every host of it:
            # --include takes the node set (quoted: its brackets are a shell's glob).
            fix = fix.replace("--include <host>", f"--include {shlex.quote(fold(labels))}")
        found.append((status, name, detail, fix, labels))
    return found


def _without(text: str, names: Sequence[str]) -> str:
    for name in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.]){re.escape(name)}(?![\w])", "<host>", text)
    return text


def verdict(report: CheckReport) -> str:
    fails = len(report.failures(FAIL))
    warns = len(report.failures(WARN))
    n = len(report.hosts)
    port = "none free" if report.start_port is None else str(report.start_port)
    where = f"{n} host{'s' if n != 1 else ''}, start port {port}"
    warned = f", {warns} warning{'s' if warns != 1 else ''}" if warns else ""
    if report.ok:
        return f"ready: {where}{warned} ({report.duration:.1f}s)"
    bad = len({h.host.rank for h, _ in report.failures(FAIL)})
    return (f"NOT ready: {fails} failed check{'s' if fails != 1 else ''} on {bad} "
            f"host{'s' if bad != 1 else ''}{warned}; {where} ({report.duration:.1f}s)")


def shared_lines(report: CheckReport) -> List[str]:
    """One line per workdir that several hosts see as one directory (NFS homes)."""
    return [f"workdir: one directory shared by {len(group)} hosts ({fold(list(group))}): "
            f"a sync writes it once, from {group[0]}" for group in report.shared]


def matrix_lines(report: CheckReport) -> List[str]:
    """The ping matrix as text rows (from: to...), only when a pair did not answer."""
    matrix = report.ping_matrix
    pairs = matrix.failed_pairs()
    if not pairs:
        return []
    n = len(matrix.labels)
    if n > MATRIX_LIMIT:
        return ["no echo: " + ", ".join(f"{matrix.labels[i]} -> {matrix.labels[j]}"
                                        for i, j in pairs[:40])]
    width = max(len(label) for label in matrix.labels)
    lines = ["ping matrix, from (row) to (column): ok = echo, X = no echo, ? = not asked",
             " " * (width + 5) + "".join(f"{j:>4}" for j in range(n))]
    for i, row in enumerate(matrix.rows):
        marks = ["." if i == j else "?" if row is None else "X" if row[j] is None else "ok"
                 for j in range(n)]
        lines.append(f"{matrix.labels[i]:<{width}} {i:>3} " + "".join(f"{m:>4}" for m in marks))
    return lines


def detail_lines(report: CheckReport) -> List[str]:
    """Every check of every host on its own line (``--verbose``)."""
    return [f"{h.host.label} [{h.host.rank}] {r.name}: {r.status}: {r.detail}"
            + (f" (fix: {r.fix})" if r.fix and r.status in (WARN, FAIL) else "")
            for h in report.hosts for r in h.results]


# -- plain text -----------------------------------------------------------------------
def render_plain(report: CheckReport, out: IO[str], verbose: bool = False) -> None:
    names = columns(report)
    table = [["RANK", "HOST"] + [n.upper() for n in names]]
    for hosts, cells in fold_rows(report):
        table.append(list(row_labels(hosts)) + [PLAIN[s] + text for s, text in cells])
    widths = [max(len(row[k]) for row in table) for k in range(len(table[0]))]
    for row in table:
        out.write("  ".join(text.ljust(w) for text, w in zip(row, widths)).rstrip() + "\n")
    lines = []
    for status, name, detail, fix, hosts in findings(report):
        lines.append(f"{status.upper()} {fold(hosts)}: {name}: {detail}")
        if fix:
            lines.append(f"     fix: {fix}")
    if lines:
        out.write("\n" + "\n".join(lines) + "\n")
    matrix = matrix_lines(report)
    if matrix:
        out.write("\n" + "\n".join(matrix) + "\n")
    if verbose:
        out.write("\n" + "\n".join(detail_lines(report)) + "\n")
    if report.shared:
        out.write("\n" + "\n".join(shared_lines(report)) + "\n")
    out.write(f"\n{verdict(report)}\n")
    out.flush()


def render_json(report: CheckReport, out: IO[str], collective=None, spares=None) -> None:
    """The check's JSON document; with ``--collective``, its figures under "collective"
    (see check/collective.collective_to_json); ``spares`` (ready, unusable, warnings) when
    the command was given spare hosts (they never change ``ok``)."""
    doc = report.to_json()
    if collective is not None:
        from ..check.collective import collective_to_json

        doc["collective"] = collective_to_json(collective)
    if spares is not None:
        doc["spares"] = spares
    out.write(json.dumps(doc, indent=2) + "\n")
    out.flush()


# -- rich -----------------------------------------------------------------------------
def render_rich(report: CheckReport, console, verbose: bool = False) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    names = columns(report)
    rows = fold_rows(report)
    compact = console.width < wide_width(names, rows)
    short = short_headers()
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, header_style="bold")
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("host", no_wrap=True, min_width=max(len(row_labels(h)[1]) for h, _ in rows))
    for name in names:
        table.add_column(short[name] if compact else name, no_wrap=compact)
    for hosts, cells in rows:
        ranks, labels = row_labels(hosts)
        table.add_row(ranks, labels, *[Text(SYMBOL[s] if compact else f"{SYMBOL[s]} {text}".rstrip(),
                                            style=STYLE[s]) for s, text in cells])
    console.print(table)
    if compact:
        console.print(Text("  ".join(f"{short[n]}={n}" for n in names if short[n] != n),
                           style="dim"))
    for status, name, detail, fix, hosts in findings(report):
        line = Text()
        line.append(f"{SYMBOL[status]} {fold(hosts)}", style=STYLE[status])
        line.append(f"  {name}: ", style="bold")
        line.append(detail)
        console.print(line)
        if fix:
            console.print(Text(f"    fix: {fix}", style="cyan"))
    matrix = matrix_lines(report)
    if matrix:
        console.print()
        for text in matrix:
            console.print(Text(text, style="red" if " X" in text else ""))
    if verbose:
        console.print()
        for text in detail_lines(report):
            console.print(text, markup=False, highlight=False)
    for text in shared_lines(report):
        console.print(Text(text))
    style = "bold green" if report.ok else "bold red"
    console.print(Text(("✓ " if report.ok else "✗ ") + verdict(report), style=style))


def wide_width(names: Sequence[str], rows: Sequence[Row]) -> int:
    """Columns the full table needs: every cell on one line (symbol, space, brief)."""
    width = 4 + 2 + max(len(row_labels(hosts)[1]) for hosts, _ in rows) + 2
    for k, name in enumerate(names):
        width += max([len(name)] + [len(cells[k][1]) + 2 for _, cells in rows]) + 2
    return width


class Progress:
    """A one-line status on a terminal while hosts answer: which are still pending."""

    def __init__(self, console, hosts: Sequence):
        self.console = console
        self.stage: Dict[str, str] = {h.label: "waiting" for h in hosts}
        self._status = None

    def __enter__(self) -> "Progress":
        self._status = self.console.status(self._text())
        self._status.__enter__()
        return self

    def __call__(self, event: object) -> None:
        if not isinstance(event, CheckStage):
            return
        self.stage[event.host] = event.stage
        if self._status is not None:
            self._status.update(self._text())

    def _text(self) -> str:
        pending = [label for label, stage in self.stage.items() if stage != "done"]
        if not pending:
            return "checking: done"
        shown = fold(pending[:8]) + (" ..." if len(pending) > 8 else "")
        return f"checking {len(self.stage)} hosts: waiting for {shown}"

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)


class CheckView:
    """What ``multihost check`` shows, for one command: on a terminal a progress line
    while hosts answer, then the rich table; in a pipe (or with ``plain``, NO_COLOR,
    TERM=dumb) the same table as plain text; with ``json`` one document at the end."""

    def __init__(self, out: IO[str] = None, err: IO[str] = None, *, json: bool = False,
                 plain: bool = False, verbose: bool = False):
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.json = json
        self.verbose = verbose
        self.console = None
        # The one rule of every view: a terminal gets the table, unless NO_COLOR or TERM=dumb.
        if not json and not plain and not wants_plain(self.out):
            from rich.console import Console

            self.console = Console(file=self.out)

    @contextlib.contextmanager
    def checking(self, hosts: Sequence) -> Iterator[Optional[Progress]]:
        """The listener of the checks' progress events (None where nothing is drawn)."""
        if self.console is None:
            yield None
            return
        with Progress(self.console, hosts) as progress:
            yield progress

    def report(self, report: CheckReport) -> None:
        if self.console is not None:
            render_rich(report, self.console, verbose=self.verbose)
        elif not self.json:
            render_plain(report, self.out, verbose=self.verbose)

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Around ``--collective``'s measurement: a status line on a terminal."""
        if self.console is None:
            yield
            return
        with self.console.status("measuring links and collectives..."):
            yield

    def collective(self, collective) -> None:
        from . import collective_view

        if self.console is not None:
            collective_view.render_rich(collective, self.console)
        elif not self.json:
            collective_view.render_plain(collective, self.out)

    def finish(self, report: CheckReport, collective=None, spares: Optional[dict] = None) -> None:
        """The JSON document, or the spares' verdict: ``spares`` (ready, unusable, total,
        warnings) when the command was given spare hosts."""
        if self.json:
            shown = None if spares is None else {k: spares[k] for k in ("ready", "unusable",
                                                                        "warnings")}
            render_json(report, self.out, collective, spares=shown)
            return
        if spares is None:
            return
        for line in spares["warnings"]:
            print(f"multihost: {line}", file=self.err)
        ready = spares["ready"]
        print(f"spares: {len(ready)} of {spares['total']} ready"
              + (f" ({', '.join(ready)})" if ready else ""), file=self.out)
