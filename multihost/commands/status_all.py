"""``multihost status --all --ips=...``: every run on the given hosts, from every
controller and user (the hosts' registries), with a header; ``--state`` filters. Inside
a Slurm allocation the hosts are its nodes; where Slurm answers, its own view of the
cluster's jobs (squeue, every user) follows."""
from __future__ import annotations

import argparse
import json
import sys
import time

from .common import _count, _port

ALL_EPILOG = """\
  multihost status --all --ips=a,b,c      every run on these hosts, anyone's, queued too
  multihost status --all --ips=a,b,c --ended --mine    the runs I started, ended ones too
  multihost status --all                  the hosts of the last run started here
  multihost status --all --hostfile hosts.ini --state running --json
  multihost status --all                  inside salloc/sbatch: the allocation's nodes
"""


def add_all_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("every run on some hosts (--all)")
    group.add_argument("--all", action="store_true",
                       help="every run on the hosts given (--ips/--hostfile), of every user "
                            "and controller, queued ones too")
    group.add_argument("--state", choices=("queued", "starting", "running", "succeeded",
                                           "failed", "stopped", "lost"),
                       help="with --all: only runs in this state")
    group.add_argument("--ended", action="store_true",
                       help="with --all: ended runs too (succeeded, failed, stopped), the "
                            "worst news first")
    group.add_argument("--mine", action="store_true",
                       help="with --all: only the runs I started (this user on any controller)")
    group.add_argument("--ips", metavar="A,B,...", help="with --all: the hosts")
    group.add_argument("--hostfile", metavar="FILE", help="with --all: the hosts (INI)")
    group.add_argument("--include", metavar="HOSTS", help="with --all: only these hosts")
    group.add_argument("--exclude", metavar="HOSTS", help="with --all: leave these hosts out")
    group.add_argument("--user", help="with --all: ssh user for every host")
    group.add_argument("--port", type=_port, help="with --all: ssh port for every host")
    group.add_argument("-i", "--identity", metavar="FILE", help="with --all: ssh private key")
    group.add_argument("--accept-new-host-keys", action="store_true",
                       help="with --all: record unknown host keys")
    group.add_argument("--fanout", type=_count, default=64, metavar="N",
                       help="with --all: hosts asked at once (default 64)")


def last_runs_hosts():
    """No hosts named: those of the last run started here (said on stderr), which is
    where a team that shares them looks most days."""
    from ..errors import ConfigError
    from ..run.records import list_runs

    last = list_runs(1)
    if not last or (last[0].ssh or {}).get("transport") == "srun":   # a Slurm job's nodes are gone
        raise ConfigError("status --all asks the hosts: name them",
                          fix="add `--ips=a,b` or `--hostfile FILE` (or run it inside a Slurm "
                              "allocation: its nodes)")
    record = last[0]
    print(f"multihost: the hosts of the last run, {record.run_id} (--hostfile or --ips for "
          f"others)", file=sys.stderr)
    return tuple(record.hosts)


def main_all(args: argparse.Namespace) -> int:
    from ..errors import EXIT_CONNECT
    from ..registry.holders import chosen, gather
    from ..registry.entry import controller
    from ..slurm.jobs import cluster_jobs
    from .common import cluster_from_args, hosts_from_args, slurm_plan

    for name, default in (("workdir", None), ("python", None), ("transport", None)):
        if not hasattr(args, name):
            setattr(args, name, default)
    args.ssh_config = args.ssh_config or "~/.ssh/config"
    args.connect_timeout = args.connect_timeout or 10.0
    if args.ips or args.hostfile or slurm_plan(args).nodes:
        hosts = hosts_from_args(args)
    else:
        hosts = last_runs_hosts()
    with cluster_from_args(args, hosts) as cluster:
        runs, errors = gather(cluster)
    jobs = cluster_jobs()     # None: no Slurm here
    mine = controller().partition("@")[0] if getattr(args, "mine", False) else None
    runs = chosen(runs, ended=getattr(args, "ended", False), mine=mine, state=args.state)
    now = time.time()
    if args.json:
        print(json.dumps({"runs": [r.to_json(now) for r in runs],
                          "errors": [str(e) for e in errors],
                          "slurm": None if jobs is None else [j.to_json() for j in jobs]},
                         indent=1))
    else:
        from ..views.status_all_view import render

        render(runs, sys.stdout, now)
        if not runs:
            print("no runs on these hosts" + (f" in state {args.state}" if args.state else "")
                  + ("" if getattr(args, "ended", False) or args.state else
                     " (--ended lists those that ended)"), file=sys.stderr)
        if jobs is not None:
            from ..views.slurm_view import render_jobs

            render_jobs(jobs, sys.stdout)
    for error in errors:
        print(f"multihost: {error}", file=sys.stderr)
    return EXIT_CONNECT if errors else 0
