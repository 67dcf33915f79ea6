"""``multihost stop [RUN]``: end a run on every host, from any shell."""
from __future__ import annotations

import argparse
import sys

from .status import add_connection_options

EPILOG = """\
examples:
  multihost stop                          the last run started from this controller
  multihost stop 20261121-101500-3f2a     a run by id (a unique prefix is enough)
  multihost stop --kill-wait 0            no grace: SIGKILL at once
  multihost stop 1234                     a `run --slurm --detach` job: scancel, wait for its end

Every process of the run on every host gets SIGTERM (whole process groups, so
data-loader workers and other grandchildren too), then SIGKILL after --kill-wait
seconds. Only this run's processes are touched: they are found by the run's own
supervisor and by MULTIHOST_RUN_ID in their environment, never by name.
Works on runs whose controller died. Stopping a run that already ended does nothing.
Exit status: 0 when every host confirmed, 255 when a host could not be reached.
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("stop", help="stop a run on every host (any run, any shell)",
                            description="Stop a run on every host.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", help="run id or a unique prefix (default: the last run)")
    parser.add_argument("--kill-wait", type=float, default=None, metavar="S",
                        help="grace between SIGTERM and SIGKILL (default: the run's, 10)")
    parser.add_argument("--json", action="store_true", help="the final status as JSON")
    add_connection_options(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    import json
    import os
    import socket

    from ..errors import EXIT_CONNECT, ConfigError
    from ..run.control import stop, stop_replaced
    from ..run.records import load_run
    from ..views.status_view import render_plain
    from .status import cluster_for

    from ..registry.queue import stop_queued

    if args.run:
        ticket = stop_queued(args.run)
        if ticket:
            print(f"queued run {args.run} ({ticket}) left the queue")
            return 0
    from .run_batch import batch_job, stop as batch_stop

    job = batch_job(args.run)   # `run --slurm --detach`: scancel of its batch job
    if job is not None:
        return batch_stop(job, args)
    record = load_run(args.run)
    grace = record.kill_wait if args.kill_wait is None else args.kill_wait
    if grace < 0:
        raise ConfigError("--kill-wait takes seconds, 0 or more", fix="e.g. --kill-wait 10")
    reason = f"multihost stop from {socket.gethostname()} (pid {os.getpid()})"
    with cluster_for(record, args) as cluster:
        status = stop(cluster, record, grace, reason)
        left = stop_replaced(record, cluster.options, grace, reason)
    if args.json:
        print(json.dumps(status.to_json(), indent=1, default=str))
    else:
        render_plain(status, sys.stdout)
    for node in status.nodes:
        if node.error is not None:
            print(f"multihost: {node.error} (run `multihost stop {record.run_id}` again "
                  "once it answers)", file=sys.stderr)
    for label, error in left:  # a host a spare replaced once it was lost: best effort
        said = "stopped there too" if error is None else (
            f"not reached ({getattr(error, 'cause', error)}); "
            f"run `multihost stop {record.run_id}` again once it answers")
        print(f"multihost: {label} (lost, replaced by a spare): {said}", file=sys.stderr)
    return EXIT_CONNECT if any(n.error for n in status.nodes) else 0
