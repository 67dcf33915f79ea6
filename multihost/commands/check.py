"""``multihost check``: the preflight. Can this exact cluster run this exact job?"""
from __future__ import annotations

import argparse
import sys

from .common import HOST_OPTIONS_HELP, add_host_options, add_job_options, add_spare_option

EPILOG = HOST_OPTIONS_HELP + """
examples:
  multihost check --ips=10.0.0.1,10.0.0.2
  multihost check --hostfile hosts.ini --gpus 0,1,2,3 --start-port 17000
  multihost check --hostfile hosts.ini --start-port auto --json | jq .start_port
  multihost check --ips=10.0.0.1,10.0.0.2 --nproc_per_node 2 --python /opt/venv/bin/python
  multihost check --hostfile hosts.ini --collective           links and all_reduce busbw

Checks, on every host at once: reach (ping from here), ssh (password-free login),
software (python, torch/paddle, CUDA, NCCL: the same everywhere), gpus (the requested
devices exist), ports (FLAGS_START_PORT and the next ones are free), rendezvous (every
host connects to the first host's master port), ping (every host pings every other),
iface (the interface towards the first host; hostnames that resolve to loopback),
workdir (not a system directory, ~ or ~/.ssh), disk (free space in the workdir), clock
(skew against this machine), leftovers (processes of earlier multihost runs), data
(--data exists everywhere), image (with --image: the engine, the image's id the same
everywhere, containers left by earlier runs).
Each is explained, with its fixes, in docs/check.md.

Exit status: 0 when no check failed (warnings allowed), 3 when one did, or when
--collective named a slow host or link (measured twice before it is called slow).
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "check", help="preflight: prove the cluster can run the job",
        description="Check, on every host in parallel, everything the job needs: reach, ssh, "
                    "software, GPUs, ports, the rendezvous path, host-to-host ping, "
                    "interfaces, disk, clock and leftovers of earlier runs.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_host_options(parser)
    add_job_options(parser)
    add_spare_option(parser)
    group = parser.add_argument_group("output")
    group.add_argument("--json", action="store_true",
                       help="print one JSON document (ok, start_port, per host: rank, address, "
                            "checks)")
    group.add_argument("--plain", action="store_true",
                       help="plain text even on a terminal (the default in a pipe, "
                            "with NO_COLOR or TERM=dumb)")
    group.add_argument("-v", "--verbose", action="store_true",
                       help="also print every check's detail, one line each")
    group.add_argument("--timeout", type=float, default=8.0, metavar="S",
                       help="seconds each host may spend on its checks (default 8)")
    parser.add_argument("--image", default=None, metavar="IMAGE",
                        help="the job runs in this image (run --image): check every host's "
                             "engine, that the image is the same everywhere, and containers "
                             "left by earlier runs")
    parser.add_argument("--engine", default=None, choices=("podman", "docker"),
                        help="with --image: the hosts' container engine")
    parser.add_argument("--queue", action="store_true",
                        help="when another run holds the hosts, wait in line for them, then "
                             "check (as `run --queue` does; docs/sharing.md)")
    bench = parser.add_argument_group("collective (docs/collective.md)")
    bench.add_argument("--collective", action="store_true",
                       help="after the checks: host-to-host throughput in rounds of disjoint "
                            "pairs, and all_reduce/all_gather bus bandwidth with the job's "
                            "python (gloo on CPU, NCCL with --gpus); names a slow host or link")
    bench.add_argument("--collective-sizes", default=None, metavar="SIZES",
                       help="message sizes: a range growing 4x (default 1K-256M) or a list "
                            "(1K,1M,64M)")
    return parser


def main(args: argparse.Namespace) -> int:
    from ..check.fixes import given_flags
    from ..check.preflight import run_checks
    from ..errors import EXIT_CHECK, EXIT_OK
    from ..run.steps import checked_in_background
    from ..views.check_view import CheckView
    from .common import cluster_from_args, inventory_from_args, job_options_from_args

    hosts, spares = inventory_from_args(args)
    job = job_options_from_args(args, hosts)
    sizes = None
    if args.collective or args.collective_sizes:
        from ..check.collective import DEFAULT_SIZES, parse_sizes

        sizes = parse_sizes(args.collective_sizes or DEFAULT_SIZES)
    view = CheckView(json=args.json, plain=args.plain, verbose=args.verbose)
    collective = None
    warnings = []
    with cluster_from_args(args, hosts) as cluster:
        # A dead spare is known before it is needed, and never makes the cluster not ready.
        unusable = checked_in_background(cluster, spares, job, warnings.append)
        ticket = None
        if args.queue:  # the busy check's fix: its turn first, then the check
            from ..registry.queue import ticket_for

            ticket = ticket_for(cluster, job, job.start_port, "")
            ticket.wait_turn(lambda text: print(f"multihost: {text}", file=sys.stderr, flush=True))
        try:
            with view.checking(hosts) as progress:
                report = run_checks(cluster, job, budget=args.timeout, progress=progress,
                                    given=given_flags(vars(args)))
        finally:
            if ticket is not None:
                ticket.leave()
        view.report(report)
        if sizes:
            from ..check.collective_run import run_collective

            with view.measuring():
                collective = run_collective(cluster, job, report, sizes)
            view.collective(collective)
        bad = unusable()
    usable = [h.label for h in spares if h.label not in bad]
    view.finish(report, collective, spares={
        "ready": usable, "unusable": list(bad), "total": len(spares),
        "warnings": warnings} if spares else None)
    if not report.ok or (collective is not None and not collective.ready):
        return EXIT_CHECK
    return EXIT_OK
