"""``multihost sync``: make the code identical on every host, and check (or repair) data."""
from __future__ import annotations

import argparse
import os
import sys

from .common import HOST_OPTIONS_HELP, add_code_options, add_host_options

EPILOG = HOST_OPTIONS_HELP + """
examples:
  multihost sync --ips=10.0.0.1,10.0.0.2                 this directory to ~/multihost/<name>
  multihost sync --hostfile hosts.ini --code ~/PaddleDetection --dry-run
  multihost sync --hostfile hosts.ini --verify           re-hash everything, trust no cache
  multihost sync --hostfile hosts.ini --data /data/coco  also check the dataset everywhere
  multihost sync --hostfile hosts.ini --data /data/coco --sync-data --no-code

What travels: every file of the code directory except what .gitignore or .multihostignore
exclude (a .multihostignore has the last word: '!file' re-includes), and never .git.
Only changed files travel (compared by content), in one stream per host; files removed
here are removed on the hosts if a sync had put them there; job outputs are never touched.
--data PATH must already be on every host; --sync-data copies what differs from the
first host to the others, host to host, moving replaced files aside (nothing is deleted).
Exit status: 0 when everything is identical, 4 when a host could not be made identical.
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("sync", help="make the code (and check data) identical on every host",
                            description="Make the code directory identical in every host's "
                                        "workdir; check that datasets are identical.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_host_options(parser)
    group = parser.add_argument_group("sync")
    add_code_options(group)
    group.add_argument("--dry-run", "-n", action="store_true",
                       help="list what would change on each host; change nothing")
    group.add_argument("--verify", action="store_true",
                       help="re-hash every file on both sides instead of trusting the caches")
    group.add_argument("--sync-data", action="store_true",
                       help="copy data that differs from the first host to the others, host to host")
    group.add_argument("--no-code", action="store_true", help="leave the code alone (data only)")
    group.add_argument("--plain", action="store_true",
                       help="plain progress lines instead of progress bars")
    return parser


def data_paths(hosts) -> tuple:
    """--data and the hostfile's data, in order, each once (checked on every host)."""
    seen = {}
    for host in hosts:
        for path in host.data:
            seen.setdefault(path, None)
    return tuple(seen)


def main(args: argparse.Namespace) -> int:
    from ..errors import ConfigError, SyncError
    from ..job import in_place, workdir_for
    from ..sync.pipeline import sync_code
    from ..views.sync_view import SyncView
    from .common import cluster_from_args, hosts_from_args, job_options_from_args

    hosts = hosts_from_args(args)
    job = job_options_from_args(args)
    paths = data_paths(hosts)
    if args.sync_data and not paths:
        raise ConfigError("--sync-data needs a dataset", fix="name it with --data PATH "
                                                            "(or data = PATH in the hostfile)")
    if args.no_code and not paths:
        raise ConfigError("--no-code leaves nothing to do", fix="add --data PATH, or drop --no-code")
    if not args.no_code:
        from ..check.checks.workdir import refuse_unsafe_workdirs

        refuse_unsafe_workdirs(hosts, job.code)
    workdirs = {host.rank: workdir_for(host, job.code) for host in hosts}
    view = SyncView(plain=True if args.plain else None)
    here = not args.no_code and all(in_place(host, job.code) for host in hosts)
    if here:  # syncing the code onto itself: a job with no hosts runs where it is
        print(f"multihost: no hosts given: the job runs in {os.path.abspath(job.code)} "
              "itself, nothing to sync (--ips or --hostfile to sync to hosts)", file=sys.stderr)
    with cluster_from_args(args, hosts) as cluster:
        try:
            if not args.no_code and not here:
                try:
                    report = sync_code(cluster, job.code, workdirs=workdirs, dry_run=args.dry_run,
                                       verify=args.verify, listener=view)
                except SyncError as err:
                    if getattr(err, "report", None) is not None:
                        view.show_sync(err.report)
                    raise
                view.show_sync(report)
            if paths:
                from ..data import data_error, sync_data, verify_data

                data = verify_data(cluster, paths, workdirs=workdirs, verify=args.verify,
                                   listener=view)
                view.show_data(data)
                if not data.ok and args.sync_data and not args.dry_run:
                    copied = sync_data(cluster, paths, workdirs=workdirs, listener=view, report=data)
                    view.show_data_sync(copied)
                    data = verify_data(cluster, paths, workdirs=workdirs, listener=view)
                    view.show_data(data)
                if not data.ok:
                    from ..check.fixes import given_flags

                    raise data_error(data, given_flags(vars(args)))
        finally:
            view.close()
    return 0
