"""How a run's status looks: a table per node (rich on a terminal, aligned plain text in
a pipe), the run's header lines and the list of recent runs. Rendering only: the status
itself is computed in ``multihost.run.control``."""
from __future__ import annotations

import time
from typing import IO

from ..remote.run.states import LAUNCH_LOST


def _ago(when, now) -> str:
    if not when:
        return "-"
    seconds = int(now - when)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _ranks(first: int, count: int) -> str:
    return str(first) if count == 1 else f"{first}-{first + count - 1}"


def rows(status, now):
    """The table's cells, one row per node (the presentation of RunStatus)."""
    from ..run.exits import decode_exit

    out = []
    for node in status.nodes:
        view = node.view
        if view is None:
            out.append((str(node.node_rank), node.host, "unreachable",
                        _ranks(node.rank_offset, node.nproc), "-", "-", "-",
                        node.error.cause if node.error else ""))
            continue
        exit_text = "-"
        stopped = view.state == "stopped"
        if view.finished:
            exit_text = decode_exit(view.exit_code, view.signal, stopped) \
                if view.state != "succeeded" else "0"
        failed = [r for r in view.ranks if r.failed]
        detail = view.detail
        if failed:
            first = min(failed, key=lambda r: r.ended or now)
            detail = (f"rank {first.rank}: {decode_exit(first.exit_code, first.signal, stopped)}"
                      + (f"; {detail}" if detail else ""))
        out.append((str(node.node_rank), node.host, view.state,
                    _ranks(node.rank_offset, node.nproc), str(view.procs),
                    _ago(view.started, view.ended or now), exit_text, detail))
    return out


HEADERS = ("node", "host", "state", "ranks", "procs", "uptime", "exit", "detail")


def gpu_lines(status, now):
    """The latest GPU sample of each host that has one (none: no lines at all)."""
    from .gpus import describe

    lines = [f"  {node.host}: {describe([node.gpu], idle=node.state == 'running')} "
             f"({_ago(node.gpu.time, now)} ago)" for node in status.nodes if node.gpu]
    return ["gpus, latest sample:"] + lines if lines else []


def header_lines(status):
    record = status.record
    cause = record.root_cause
    named = f'"{record.name}" ' if record.name else ""
    lines = [f"run {named}{record.run_id}: {record.state}"
             + (f" (exit {record.exit_code})" if record.exit_code not in (None, 0) else ""),
             f"  {' '.join(record.command)}   [{record.launcher}, FLAGS_START_PORT="
             f"{record.start_port}, {record.world_size} ranks]"]
    if cause:
        where = f"rank {cause.rank}" if cause.rank is not None else f"node {cause.node_rank}"
        lines.append(f"  root cause: {cause.host} {where}: {cause.reason}")
        lines += [f"    then {line}" for line in cause.after]
    if any(getattr(node.view, "detail", "") == LAUNCH_LOST for node in getattr(status, "nodes", ())):
        lines.append(f"  {LAUNCH_LOST}: nothing of it runs (fix: start it again: multihost "
                     f"rerun {record.run_id}; give --launch-timeout S if its launch is slow)")
    if record.stragglers:
        from ..run.stragglers import describe, from_json

        lines.append(f"  stragglers: {describe(from_json(record.stragglers))}")
    from ..run.restarts import attempt_label, attempt_line

    if record.max_restarts:
        lines[0] += f", {attempt_label(record.attempt, record.max_restarts)}"
        lines += [f"  earlier {attempt_line(entry, record.max_restarts)}"
                  for entry in record.attempts]
    if record.replacements:
        from ..spares import Replacement

        for entry in record.replacements:
            change = Replacement.from_json(entry)
            when = (f", from {attempt_label(change.attempt, record.max_restarts)}"
                    if record.max_restarts else "")
            lines.append(f"  {change.line}{when}")
    return lines


def render_plain(status, out: IO[str]) -> None:
    table = [HEADERS] + rows(status, time.time())
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADERS) - 1)]
    for line in header_lines(status):
        out.write(line + "\n")
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        out.write("  ".join(cells).rstrip() + "\n")
    for line in gpu_lines(status, time.time()):
        out.write(line + "\n")


def render_rich(status, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    styles = {"running": "green", "succeeded": "bold green", "failed": "bold red",
              "stopped": "yellow", "unreachable": "bold magenta", "lost": "bold magenta"}
    console = console or Console()
    for line in header_lines(status):
        console.print(line, highlight=False)
    table = Table(*HEADERS)
    for row in rows(status, time.time()):
        table.add_row(*row[:2], f"[{styles.get(row[2], '')}]{row[2]}", *row[3:])
    console.print(table)
    for line in gpu_lines(status, time.time()):
        console.print(line, highlight=False, markup=False)


LIST_HEADERS = ("run", "name", "started", "state", "exit", "took", "hosts", "command")


def list_rows(records, now, gone=frozenset()):
    """The cells of `status --list`, one row per run, newest first. A run in ``gone``
    (its controller is gone and its record not final) is shown with a question mark: its
    state is that controller's last word, not the hosts'."""
    out = []
    for r in records:
        began = r.started or r.created
        took = _ago(began, r.ended or now) if began else "-"
        state = f"{r.state}?" if r.run_id in gone else str(r.state)
        out.append((r.run_id, r.name or "-", time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created)),
                    state, "-" if r.exit_code is None else str(r.exit_code), took,
                    str(len(r.nodes)), " ".join(r.command)))
    return out


def render_list(records, out: IO[str], gone=frozenset()) -> None:
    table = [LIST_HEADERS] + list_rows(records, time.time(), gone)
    widths = [max(len(row[i]) for row in table) for i in range(len(LIST_HEADERS) - 1)]
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        out.write("  ".join(cells).rstrip() + "\n")
    for r in records:
        if r.run_id in gone:
            out.write(f"{r.run_id}: {r.state}? controller gone (killed, or detached): its "
                      f"record is as old as its last word (fix: multihost status {r.run_id} "
                      f"asks the hosts)\n")


def list_json(records, gone=frozenset()) -> list:
    return [{"run_id": r.run_id, "name": r.name, "state": str(r.state), "exit_code": r.exit_code,
             "hosts": [n.label for n in r.nodes], "command": list(r.command),
             "created": r.created, "started": r.started, "ended": r.ended,
             "controller_gone": r.run_id in gone} for r in records]
