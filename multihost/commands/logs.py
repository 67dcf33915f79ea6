"""``multihost logs``: every rank's log of a run, from the hosts and the controller's mirror."""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time

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
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--plain", action="store_true", help="plain prefixed lines, no dashboard")
    view.add_argument("--json", action="store_true", help="one JSON event per line")
    parser.add_argument("-F", "--ssh-config", default="~/.ssh/config", metavar="FILE",
                        help="ssh client config to read (default ~/.ssh/config)")
    parser.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                        help="seconds to wait for a host to answer (default 10)")
    return parser


def _filter(args):
    from ..errors import ConfigError
    from ..mirror import LineFilter, parse_ranks, parse_since

    pattern = None
    if args.grep:
        try:
            pattern = re.compile(args.grep)
        except re.error as exc:
            raise ConfigError(f"--grep {args.grep!r} is not a valid regex: {exc}",
                              fix="check the pattern (Python regex syntax)") from None
    return LineFilter(ranks=parse_ranks(args.rank) if args.rank else None,
                      hosts=set(args.host) if args.host else None, pattern=pattern,
                      since=parse_since(args.since, time.time()) if args.since else None,
                      roles=set(args.role) if args.role else None)


class _Filtered:
    """Passes on the lines the user asked for, and every other event."""

    def __init__(self, view, keep):
        self.view = view
        self.keep = keep

    def __call__(self, event):
        from ..events import LogBlock, LogLine

        if isinstance(event, LogBlock):
            event = self.keep.block(event)
            if event is not None:
                self.view(event)
        elif not isinstance(event, LogLine) or self.keep.accepts(event):
            self.view(event)


def main(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..fanout import Cluster
    from ..logs import LogFollower, nodes_of
    from ..mirror import read_mirror
    from ..runs import load_run
    from ..transport import SshOptions
    from ..views import make_view

    if args.tail is not None and args.tail < 0:
        raise ConfigError("--tail must be 0 or more", fix="e.g. --tail 100")
    keep = _filter(args)  # a bad filter is the user's typo: say so before any lookup
    record = load_run(args.run)
    pairs = list(zip(record.hosts, record.nprocs))
    nodes = nodes_of(pairs)
    options = SshOptions(connect_timeout=args.connect_timeout, config_file=args.ssh_config)
    mode = "json" if args.json else "plain" if args.plain or not args.follow else "auto"
    with Cluster(record.hosts, options) as cluster:
        # First bring the mirror up to date (hosts that are gone keep what we have).
        catch_up = LogFollower(cluster, record.run_id, pairs, record.mirror_dir,
                               lambda event: None, follow=False).start()
        catch_up.drain(timeout=max(30.0, args.connect_timeout * 2))
        catch_up.stop()
        for _, error in sorted(catch_up.errors.items()):
            print(f"multihost: {error} (showing the mirror up to where it was reached)",
                  file=sys.stderr)
        view = make_view(mode, by_rank=args.ranks)
        for block in read_mirror(record.mirror_dir, nodes, keep, tail=args.tail):
            view(block)
        if not args.follow:
            return 0
        return _follow(cluster, record, pairs, _Filtered(view, keep))


def _follow(cluster, record, pairs, listener) -> int:
    from ..events import RunFinished
    from ..logs import LogFollower

    follower = LogFollower(cluster, record.run_id, pairs, record.mirror_dir, listener,
                           follow=True).start()
    try:
        while not follower.drain(timeout=0.5):
            pass
    except KeyboardInterrupt:
        follower.stop()
        print(f"\nmultihost: stopped following; run {record.run_id} goes on "
              f"(multihost stop {record.run_id} ends it)", file=sys.stderr)
        return 130
    follower.stop()
    status = _final_status(cluster, record, follower)
    listener(RunFinished(record.run_id, status.exit_code, _cause(status.root_cause), time=time.time()))
    return status.exit_code


def _final_status(cluster, record, follower):
    """The run's end as `run` would report it: the hosts' records reconciled, the first
    failure by time as the root cause (stopped nodes are not causes)."""
    from ..errors import MultihostError
    from ..run_control import query

    try:
        final = query(cluster, record).record
    except MultihostError:
        final = record
    if final.exit_code is not None:
        return final
    states = [s for s in follower.final_states.values() if s]
    failed = [s for s in states if s.get("state") == "failed"]
    code = 0 if states and not failed else (failed[0].get("exit_code") or 1) if failed else 1
    return dataclasses.replace(final, exit_code=code if 0 <= code < 256 else 1)


def _cause(data):
    """The record's root cause (a dict) as the event the views render."""
    from ..events import RootCause

    if not data:
        return None
    return RootCause(host=data.get("host", "?"), node_rank=data.get("node_rank", -1),
                     rank=data.get("rank"), exit_code=data.get("exit_code"),
                     reason=data.get("reason", ""), tail=tuple(data.get("tail") or ()))
