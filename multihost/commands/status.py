"""``multihost status [RUN]``: every node of a run, asked now, from any shell."""
from __future__ import annotations

import argparse
import json
import sys

EPILOG = """\
examples:
  multihost status                        the last run started from this controller
  multihost status 20261121-101500-3f2a   a run by id (a unique prefix is enough)
  multihost status --json | jq '.nodes[] | select(.state != "running")'
  multihost status --list                 the runs this controller knows, newest first
  multihost status 1234                   a `run --slurm --detach` job, as Slurm sees it
  multihost status --all --ips=a,b,c      every run on these hosts, anyone's, queued too

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
    from .status_all import add_all_options
    add_all_options(parser)
    return parser


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("ssh (default: what the run was started with)")
    group.add_argument("-F", "--ssh-config", metavar="FILE", default=None,
                       help="ssh client config to read")
    group.add_argument("--connect-timeout", type=float, default=None, metavar="S",
                       help="seconds to wait for a host to answer")


def cluster_for(record, args):
    from ..run.control import cluster_of

    return cluster_of(record, ssh_config=args.ssh_config, connect_timeout=args.connect_timeout)


def list_runs(args) -> int:
    from ..run.records import list_runs as recent

    from ..views.status_view import list_json, render_list

    from ..run.control import controller_gone

    records = recent()
    gone = {r.run_id for r in records if controller_gone(r)}
    if args.json:
        print(json.dumps(list_json(records, gone), indent=1))
        return 0
    render_list(records, sys.stdout, gone)
    if not records:
        print("no runs recorded on this controller yet", file=sys.stderr)
    return 0


def show_queued(args) -> bool:
    """A run still waiting (in Slurm's queue for `run --slurm`, in line on its hosts for
    `run --queue`) has no record yet and is the newest run: say so. With a run named,
    only that one (by its --name or id)."""
    from ..registry.queue import waiting, waiting_line
    from ..slurm.submit import queued_jobs, queued_line

    jobs = queued_jobs() if args.run is None else []
    for job in jobs:
        if args.json:
            print(json.dumps({"state": "queued", "slurm_job": job["job_id"],
                              "reason": job["reason"], "nodes": job.get("nodes")}))
        else:
            print(queued_line(job))
    tickets = waiting(args.run)
    for ticket in tickets:
        if args.json:
            print(json.dumps({"state": "queued", "run_id": ticket.get("run_id"),
                              "name": ticket.get("name"), "hosts": ticket.get("hosts")}))
        else:
            print(waiting_line(ticket))
    return bool(jobs or tickets)


def main(args: argparse.Namespace) -> int:
    from ..errors import EXIT_CONNECT
    from ..run.control import query
    from ..run.records import load_run
    from ..views import wants_plain
    from ..views.status_view import render_plain, render_rich

    if getattr(args, "all", False):
        from .status_all import main_all
        return main_all(args)
    if args.list:
        return list_runs(args)
    if show_queued(args):
        return 0
    from .run_batch import batch_job, status as batch_status

    job = batch_job(args.run)   # `run --slurm --detach`: Slurm's view of its batch job
    if job is not None:
        return batch_status(job, args)
    record = load_run(args.run)
    with cluster_for(record, args) as cluster:
        status = query(cluster, record)
    if args.json:
        print(json.dumps(status.to_json(), indent=1, default=str))
    elif args.plain or wants_plain(sys.stdout):
        render_plain(status, sys.stdout)
    else:
        render_rich(status)
    for node in status.nodes:
        if node.error is not None:
            print(f"multihost: {node.error}", file=sys.stderr)
    return EXIT_CONNECT if any(n.error for n in status.nodes) else 0
