"""``multihost logs``: every rank's log of a run, from the hosts and the controller's mirror."""
from __future__ import annotations

import argparse
import sys

EPILOG = """\
examples:
  multihost logs                      every line of the last run, prefixed HOST [RANK]
  multihost logs --follow             stream until the run ends (Ctrl-C only stops following)
  multihost logs 20261121-101500-3f2a --rank 0,3 --tail 50
  multihost logs --host 10.0.0.2 --grep 'loss|Error' --since 15m
  multihost logs --follow --json      one JSON event per line, for other tools

Lines are mirrored under the run's log directory (default ./log/RUN/HOST/log/workerlog.N,
paddle's naming) as they arrive, resuming from the last byte the mirror has, so a
reattach neither loses nor repeats a line; `logs` reads the mirror when a host is gone.
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("logs", help="show or follow the logs of a run",
                            description="Show or follow every rank's log of a run.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", help="run id (default: the last run)")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="stream new lines until the run ends, then exit with its status")
    parser.add_argument("--rank", help="only these global ranks, e.g. 0,3 or 0-7")
    parser.add_argument("--host", action="append", help="only this host (repeatable)")
    parser.add_argument("--role", action="append", choices=("server", "worker", "launcher"),
                        help="only a parameter-server job's servers, or its workers (the "
                             "trainers: every rank), or the launchers' own lines (repeatable)")
    parser.add_argument("--tail", type=int, metavar="N", help="only the last N lines per rank")
    parser.add_argument("--grep", metavar="PATTERN", help="only lines matching this regex")
    parser.add_argument("--since", metavar="AGE", help="only lines that arrived since, e.g. 15m")
    parser.add_argument("--ranks", action="store_true", help="dashboard: one row per rank")
    parser.add_argument("--attempt", type=int, metavar="K",
                        help="the lines of attempt K (1 is the first) of a run with "
                             "--max-restarts (default: the latest)")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--plain", action="store_true", help="plain prefixed lines, no dashboard")
    view.add_argument("--json", action="store_true", help="one JSON event per line")
    parser.add_argument("-F", "--ssh-config", default="~/.ssh/config", metavar="FILE",
                        help="ssh client config to read (default ~/.ssh/config)")
    parser.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                        help="seconds to wait for a host to answer (default 10)")
    return parser


def request_from_args(args: argparse.Namespace):
    from ..logs.show import LogsRequest

    return LogsRequest(run=args.run, ranks=args.rank, hosts=tuple(args.host or ()),
                       roles=tuple(args.role or ()), tail=args.tail, grep=args.grep,
                       since=args.since, attempt=args.attempt, follow=args.follow,
                       connect_timeout=args.connect_timeout, ssh_config=args.ssh_config)


def main(args: argparse.Namespace) -> int:
    from ..logs.show import RunLogs, earlier_attempt, fit_to_run, line_filter
    from ..run.records import load_run
    from ..views import make_view

    request = request_from_args(args)
    keep = line_filter(request)  # a bad filter is the user's typo: say so before any lookup
    from .run_batch import batch_job, logs as batch_logs

    job = batch_job(args.run)   # `run --slurm --detach`: its batch job's output file
    if job is not None:
        return batch_logs(job, args)
    record = load_run(request.run)
    keep = fit_to_run(keep, record, request)
    blocks = earlier_attempt(record, request, keep)
    if blocks is not None:
        view = make_view("json" if args.json else "plain", by_rank=args.ranks)
        for block in blocks:
            view(block)
        return 0
    mode = "json" if args.json else "plain" if args.plain or not args.follow else "auto"
    with RunLogs(record, request) as logs:
        # First bring the mirror up to date (hosts that are gone keep what we have).
        for error in logs.catch_up():
            _say(f"{error} (showing the mirror up to where it was reached)")
        view = make_view(mode, by_rank=args.ranks, on_stop=logs.stop, on_detach=logs.detach) \
            if mode == "auto" else make_view(mode)
        if mode == "auto" and args.follow:  # the dashboard's title: which run this is
            from ..events import RunStarted

            view(RunStarted(record.run_id, tuple(n.label for n in record.nodes),
                            max(record.nprocs), " ".join(record.command), record.created,
                            name=record.name))
        try:
            for block in logs.blocks(keep):
                view(block)
            logs.check_whole(_say)
            if not args.follow:
                return 0
            return _follow(logs, view, keep)
        finally:  # the dashboard gives the terminal back before anything else is printed
            getattr(view, "close", lambda: None)()


def _say(text: str) -> None:
    print(f"multihost: {text}", file=sys.stderr)


def _follow(logs, view, keep) -> int:
    """Follow to the run's end; leaving it running (Ctrl-C, the dashboard's [d]) says so,
    once the dashboard gave the terminal back."""
    from ..logs.show import Filtered

    end = logs.follow(Filtered(view, keep), _say)
    if end.detached or end.interrupted:
        getattr(view, "close", lambda: None)()
        run_id = logs.record.run_id
        after_ctrl_c = "\n" if end.interrupted else ""   # past the ^C the terminal echoed
        print(f"{after_ctrl_c}multihost: stopped following; run {run_id} goes on "
              f"(multihost stop {run_id} ends it)", file=sys.stderr)
    return end.exit_code
