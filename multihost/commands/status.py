"""``multihost status [RUN]``: every node of a run, asked now, from any shell."""
from __future__ import annotations

import argparse
import json
import sys
import time

EPILOG = """\
examples:
  multihost status                        the last run started from this controller
  multihost status 20261121-101500-3f2a   a run by id (a unique prefix is enough)
  multihost status --json | jq '.nodes[] | select(.state != "running")'
  multihost status --list                 the runs this controller knows, newest first

Works on any run, including one whose controller died or was detached: the hosts are
found again from the run's record in ~/.multihost/runs/RUN/run.json.
Exit status: 0 when every node answered, 255 when a host could not be reached.
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("status", help="show every node of a run (any run, any shell)",
                            description="Show the state of every node of a run.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", help="run id or a unique prefix (default: the last run)")
    parser.add_argument("--list", action="store_true", help="list recent runs (no ssh)")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--plain", action="store_true", help="plain text, no table")
    view.add_argument("--json", action="store_true", help="one JSON document")
    add_connection_options(parser)
    return parser


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("ssh (default: what the run was started with)")
    group.add_argument("-F", "--ssh-config", metavar="FILE", default=None,
                       help="ssh client config to read")
    group.add_argument("--connect-timeout", type=float, default=None, metavar="S",
                       help="seconds to wait for a host to answer")


def cluster_for(record, args):
    from ..fanout import Cluster
    from ..transport import SshOptions

    ssh = record.ssh or {}
    options = SshOptions(
        connect_timeout=args.connect_timeout or ssh.get("connect_timeout", 10.0),
        accept_new_host_keys=bool(ssh.get("accept_new_host_keys", False)),
        config_file=args.ssh_config or ssh.get("config_file", "~/.ssh/config"))
    return Cluster(record.hosts, options)


def _ago(when, now) -> str:
    if not when:
        return "-"
    seconds = int(now - when)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def rows(status, now):
    """The table's cells, one row per node (the presentation of RunStatus)."""
    from ..run.outcome import decode_exit

    out = []
    for node in status.nodes:
        view = node.view
        if view is None:
            out.append((str(node.node_rank), node.host, "unreachable", f"{node.rank_offset}-"
                        f"{node.rank_offset + node.nproc - 1}", "-", "-", "-",
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
                    f"{node.rank_offset}-{node.rank_offset + node.nproc - 1}", str(view.procs),
                    _ago(view.started, view.ended or now), exit_text, detail))
    return out


HEADERS = ("node", "host", "state", "ranks", "procs", "uptime", "exit", "detail")


def header_lines(status):
    record = status.record
    cause = record.root_cause
    lines = [f"run {record.run_id}: {record.state}"
             + (f" (exit {record.exit_code})" if record.exit_code not in (None, 0) else ""),
             f"  {' '.join(record.command)}   [{record.launcher}, FLAGS_START_PORT="
             f"{record.start_port}, {record.world_size} ranks]"]
    if cause:
        where = f"rank {cause.rank}" if cause.rank is not None else f"node {cause.node_rank}"
        lines.append(f"  root cause: {cause.host} {where}: {cause.reason}")
    if record.max_restarts:
        from ..run.restarts import attempt_label, attempt_line

        lines[0] += f", {attempt_label(record.attempt, record.max_restarts)}"
        lines += [f"  earlier {attempt_line(entry, record.max_restarts)}"
                  for entry in record.attempts]
    return lines


def print_plain(status, out) -> None:
    table = [HEADERS] + rows(status, time.time())
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADERS) - 1)]
    for line in header_lines(status):
        out.write(line + "\n")
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        out.write("  ".join(cells).rstrip() + "\n")


def print_table(status) -> None:
    from rich.console import Console
    from rich.table import Table

    styles = {"running": "green", "succeeded": "bold green", "failed": "bold red",
              "stopped": "yellow", "unreachable": "bold magenta", "lost": "bold magenta"}
    console = Console()
    for line in header_lines(status):
        console.print(line, highlight=False)
    table = Table(*HEADERS)
    for row in rows(status, time.time()):
        table.add_row(*row[:2], f"[{styles.get(row[2], '')}]{row[2]}", *row[3:])
    console.print(table)


def list_runs(args) -> int:
    from ..run.records import list_runs as recent

    records = recent()
    if args.json:
        print(json.dumps([{"run_id": r.run_id, "state": r.state, "exit_code": r.exit_code,
                           "hosts": [n.label for n in r.nodes], "command": list(r.command),
                           "created": r.created} for r in records], indent=1))
        return 0
    for r in records:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created))
        print(f"{r.run_id}  {stamp}  {r.state:<10} {len(r.nodes)} host(s)  {' '.join(r.command)}")
    if not records:
        print("no runs recorded on this controller yet", file=sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    from ..errors import EXIT_CONNECT
    from ..run.control import query
    from ..run.records import load_run
    from ..views import wants_plain

    if args.list:
        return list_runs(args)
    record = load_run(args.run)
    with cluster_for(record, args) as cluster:
        status = query(cluster, record)
    if args.json:
        print(json.dumps(status.to_json(), indent=1, default=str))
    elif args.plain or wants_plain(sys.stdout):
        print_plain(status, sys.stdout)
    else:
        print_table(status)
    for node in status.nodes:
        if node.error is not None:
            print(f"multihost: {node.error}", file=sys.stderr)
    return EXIT_CONNECT if any(n.error for n in status.nodes) else 0
