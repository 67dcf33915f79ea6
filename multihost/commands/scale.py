"""``multihost scale``: the job on 1, 2, 4, ... hosts and on all of them, each point an
ordinary run, and the table of throughput, speed-up and scaling efficiency (docs/scale.md)."""
from __future__ import annotations

import argparse
import os
import sys

from .common import HOST_OPTIONS_HELP, add_host_options, add_job_file_option, add_job_options
from .jobargs import keep_words

EPILOG = HOST_OPTIONS_HELP + """
examples:
  multihost scale --hostfile hosts.ini --gpus 0,1,2,3 --seconds 120 -- train.py -c cfg.yml
  multihost scale --hostfile hosts.ini --counts 1,4 --steps 500 -- train.py
  multihost scale --hostfile hosts.ini --metric 'ips: ([0-9.]+)' --metric-is per-rank -- tools/train.py
  multihost scale --hostfile hosts.ini --markdown --png scaling.png -- train.py

Each point runs the same command with the same processes per machine on the first N
hosts (node-rank order): an ordinary run, checked, synced and recorded (`multihost
status --list`, `multihost logs RUN`). Throughput is read from every rank's log: the
speed the dashboard reads (speed:, ips:, samples/s) or --metric's first group, the
median after the first quarter (warm-up). Speed-up = T(n) / T(1); efficiency =
speed-up / n. The chart is written as a PNG (default ./scale-RUN.png, RUN the first
point's run id) and drawn as text under the table.
Exit status: 0 when every point was measured; a point that fails ends the scaling with
that run's status, after the table of the points measured before it.
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from .run import add_run_options

    parser = sub.add_parser("scale", help="measure throughput on 1, 2, 4, ... hosts: "
                                          "speed-up and scaling efficiency",
                            description="Measure how a job scales with the number of hosts.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_file_option(parser)
    add_host_options(parser)
    add_job_options(parser)
    add_run_options(parser, with_follow=False)
    group = parser.add_argument_group("scaling")
    group.add_argument("--counts", metavar="N,M,...",
                       help="host counts to measure (default 1, 2, 4, ... and every host)")
    group.add_argument("--seconds", type=float, metavar="S",
                       help="stop each point S seconds after its first throughput line")
    group.add_argument("--steps", type=int, metavar="N",
                       help="stop each point once a rank's log says step N")
    group.add_argument("--metric", metavar="REGEX",
                       help="read throughput with this regex (its first group is the number) "
                            "instead of the dashboard's speed/ips/samples-per-second")
    group.add_argument("--metric-is", default="auto", metavar="auto|global|per-rank",
                       help="what each rank prints: the job's throughput (global) or its "
                            "own (per-rank, summed); default: auto, as the dashboard tells")
    group.add_argument("--kill-wait", type=float, default=10.0, metavar="S",
                       help="grace between SIGTERM and SIGKILL when a point is stopped "
                            "(default 10)")
    chart = group.add_mutually_exclusive_group()
    chart.add_argument("--png", metavar="PATH", help="write the chart here "
                                                     "(default ./scale-RUN.png)")
    chart.add_argument("--no-png", action="store_true", help="no PNG chart")
    view = group.add_mutually_exclusive_group()
    view.add_argument("--markdown", action="store_true", help="print the table as markdown")
    view.add_argument("--json", action="store_true", help="print the table as one JSON document")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    keep_words(parser)
    return parser


def _say(text: str) -> None:
    print(f"multihost: scale: {text}", file=sys.stderr, flush=True)


def chart_path(args):
    """The PNG's path (None: no chart; "": the default, named once the first run has an
    id), refused before any run when it cannot be written."""
    from ..views.scale_png import check_png_path, have_matplotlib

    if args.no_png:
        return None
    if args.png:
        check_png_path(args.png)
        return args.png
    if not have_matplotlib():
        _say("no PNG chart: matplotlib is not installed (pip install 'multihost[chart]')")
        return None
    check_png_path(os.path.join(os.getcwd(), "scale.png"))
    return ""


def main(args: argparse.Namespace) -> int:
    from ..run import request as run_request
    from ..scale.measure import parse_metric_is
    from ..scale.plan import plan_counts
    from ..scale.runner import ScaleOptions, scale_points
    from ..scale.table import ScaleTable
    from ..scale.measure import MetricReader
    from .common import cluster_from_args, hosts_from_args, job_options_from_args
    from .jobargs import with_job_file
    from .run import save_job, script_words, user_env

    args = with_job_file(args)
    command = script_words(args.command)
    hosts = hosts_from_args(args)
    job = job_options_from_args(args, hosts)
    env = user_env(args, gpus_given=any(job.gpus_for(h) for h in hosts))
    request = run_request.RunRequest(
        command=tuple(command), job=job, launcher=args.launcher, no_python=args.no_python,
        env=env, check=not args.no_check, sync=not args.no_sync,
        allow_concurrent=args.allow_concurrent, log_dir=args.log_dir, kill_wait=args.kill_wait,
        setup=args.setup, setup_always=args.setup_always)
    options = ScaleOptions(plan_counts(len(hosts), args.counts), args.seconds, args.steps,
                           args.metric, parse_metric_is(args.metric_is))
    options.check()
    validated = run_request.validate(hosts, request)   # every mistake, before any host is asked
    png = chart_path(args)
    _say(f"{len(options.counts)} point(s) on {', '.join(map(str, options.counts))} host(s); "
         f"{validated.choice.line()}")
    points = []
    table = ScaleTable(" ".join(command), MetricReader(args.metric).label, ())
    try:
        # Each point's job file, as `run` keeps one: `multihost rerun POINT` starts that
        # point's job again, as a plain run on its hosts.
        for point in scale_points(hosts, lambda subset: cluster_from_args(args, subset),
                                  request, options, _say,
                                  on_record=lambda record: save_job(args, record, command)):
            points.append(point)
            _say(f"{point.machines} machine(s): {point.throughput:.1f} ({point.rule}, "
                 f"{point.ranks} rank(s), {point.samples} sample(s))")
    finally:  # a failed point still shows what was measured before it
        table = ScaleTable(table.command, table.metric, tuple(points))
        if points:
            show(table, args, png)
    return 0


def show(table, args, png) -> None:
    import json

    from ..views.scale_png import write_png
    from ..views.scale_view import render, to_json

    written = None
    if png is not None:
        written = write_png(table, png or f"scale-{table.points[0].run_id}.png")
    if args.json:
        document = json.loads(to_json(table))
        document["png"] = os.path.abspath(written) if written else None
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        render(table, sys.stdout, "markdown" if args.markdown else "auto")
        if args.markdown:
            from ..views.scale_view import text_chart

            sys.stdout.write("\n```\n" + text_chart(table) + "```\n")
    if written:
        _say(f"chart written to {written}")
