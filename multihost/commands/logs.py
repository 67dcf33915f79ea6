"""``multihost logs``: every rank's log of a run, from the hosts and the controller's mirror."""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path

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


def _filter(args):
    from ..errors import ConfigError
    from ..logs.mirror import LineFilter, parse_ranks, parse_since

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


def _fit_to_run(keep, record, args):
    """The filter checked against the run: a rank or host the run does not have would
    print nothing, silently, as if that rank had said nothing. Hosts may be named as
    shown (with a port) or by their bare name."""
    from ..errors import ConfigError

    world = sum(record.nprocs)
    outside = sorted(r for r in keep.ranks or () if r >= world)
    if outside:
        raise ConfigError(f"--rank {args.rank}: run {record.run_id} has no rank {outside[0]}: "
                          f"its ranks are 0-{world - 1}",
                          fix=f"pick ranks from 0-{world - 1}, e.g. --rank 0")
    if keep.hosts is None:
        return keep
    labels = {}
    for node in record.nodes:
        labels[node.label] = node.label
        labels.setdefault(str(node.host.get("name")), node.label)
    unknown = [h for h in args.host if h not in labels]
    if unknown:
        names = [node.label for node in record.nodes]
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} hosts)" if len(names) > 8 else "")
        raise ConfigError(f"--host {unknown[0]}: run {record.run_id} has no such host "
                          f"(its hosts: {shown})", fix="name one of its hosts, as listed")
    return dataclasses.replace(keep, hosts={labels[h] for h in args.host})


class _Filtered:
    """Passes on the lines the user asked for, and every other event."""

    def __init__(self, view, keep):
        self.view = view
        self.keep = keep

    def __call__(self, event):
        from ..events import LogBlock, LogLine, LogProgress

        if isinstance(event, LogBlock):
            event = self.keep.block(event)
            if event is not None:
                self.view(event)
        elif not isinstance(event, (LogLine, LogProgress)) or self.keep.accepts(event):
            self.view(event)


def main(args: argparse.Namespace) -> int:
    from ..errors import BadReply, ConfigError
    from ..fanout import HostGroup
    from ..logs.follow import LogFollower, nodes_of
    from ..logs.mirror import read_mirror
    from ..run.records import load_run
    from ..transport import SshOptions
    from ..transport.srun import from_record
    from ..views import make_view

    if args.tail is not None and args.tail < 0:
        raise ConfigError("--tail must be 0 or more", fix="e.g. --tail 100")
    keep = _filter(args)  # a bad filter is the user's typo: say so before any lookup
    from .run_batch import batch_job, logs as batch_logs

    job = batch_job(args.run)   # `run --slurm --detach`: its batch job's output file
    if job is not None:
        return batch_logs(job, args)
    record = load_run(args.run)
    keep = _fit_to_run(keep, record, args)
    from ..run.restarts import mirror_of

    mirror = mirror_of(record, args.attempt)
    if mirror != record.log_dir:
        # An earlier attempt: over, and mirrored to its end before the next one started
        # (the hosts' run directories now hold the latest attempt).
        if args.follow:
            raise ConfigError(f"--attempt {args.attempt} of run {record.run_id} has ended",
                              fix="drop --follow, or --attempt to follow the latest")
        view = make_view("json" if args.json else "plain", by_rank=args.ranks)
        for block in read_mirror(Path(mirror), nodes_of(_attempt_pairs(record, args.attempt)),
                                 keep, tail=args.tail):
            view(block)
        return 0
    pairs = list(zip(record.hosts, record.nprocs))
    nodes = nodes_of(pairs)
    options = from_record(record.ssh, SshOptions(connect_timeout=args.connect_timeout,
                                                  config_file=args.ssh_config))
    mode = "json" if args.json else "plain" if args.plain or not args.follow else "auto"
    with HostGroup(record.hosts, options) as cluster:
        # First bring the mirror up to date (hosts that are gone keep what we have).
        catch_up = LogFollower(cluster, record.run_id, pairs, record.mirror_dir,
                               lambda event: None, follow=False).start()
        catch_up.drain(timeout=max(30.0, args.connect_timeout * 2))
        catch_up.stop()
        for _, error in sorted(catch_up.errors.items()):
            if not isinstance(error, BadReply):
                print(f"multihost: {error} (showing the mirror up to where it was reached)",
                      file=sys.stderr)
        keys = _Keys(cluster, record)
        view = make_view(mode, by_rank=args.ranks, on_stop=keys.stop, on_detach=keys.detach) \
            if mode == "auto" else make_view(mode)
        if mode == "auto" and args.follow:  # the dashboard's title: which run this is
            from ..events import RunStarted

            view(RunStarted(record.run_id, tuple(n.label for n in record.nodes),
                            max(record.nprocs), " ".join(record.command), record.created,
                            name=record.name))
        try:
            for block in read_mirror(record.mirror_dir, nodes, keep, tail=args.tail):
                view(block)
            _refuse_bad_replies(catch_up)
            behind = [(rank, why) for rank, why in sorted(catch_up.mirror_behind.items()) if why]
            if behind and not args.follow:  # what was shown lacks lines: never pass for whole
                from ..errors import MultihostError

                rank, why = behind[0]
                raise MultihostError(f"the log mirror lacks lines the host still has ({why}); "
                                     f"the lines shown stop where it does",
                                     host=record.hosts[rank].label,
                                     fix=f"free space under {record.mirror_dir}, then run "
                                         f"`multihost logs {record.run_id}` again")
            if not args.follow:
                return 0
            return _follow(cluster, record, pairs, _Filtered(view, keep), keys)
        finally:  # the dashboard gives the terminal back before anything else is printed
            getattr(view, "close", lambda: None)()


def _refuse_bad_replies(follower) -> None:
    """A host whose stream broke the protocol ends the command with an error naming it
    (the others' are said first): its lines stop at the last good frame."""
    from ..errors import BadReply

    bad = [error for _, error in sorted(follower.errors.items()) if isinstance(error, BadReply)]
    for error in bad[1:]:
        print(f"multihost: {error}", file=sys.stderr)
    if bad:
        raise bad[0]


def _attempt_pairs(record, attempt):
    """(host, nproc) of an earlier attempt: a spare may have taken a rank since."""
    from ..run.records import host_from_dict

    hosts = record.attempts[attempt - 1].get("host_fields") or []
    if len(hosts) != len(record.nodes):
        return list(zip(record.hosts, record.nprocs))
    return list(zip([host_from_dict(h) for h in hosts], record.nprocs))


class _Keys:
    """The dashboard's keys when following: [s] stops the run on every host (as
    `multihost stop` would, recorded as a stop from the dashboard), [d] stops following."""

    def __init__(self, cluster, record):
        self.cluster = cluster
        self.record = record
        self.detached = False

    def stop(self) -> None:
        import threading

        from ..errors import MultihostError
        from ..run.control import stop

        def one() -> None:
            try:
                stop(self.cluster, self.record, self.record.kill_wait,
                     "stopped from the dashboard ([s] in multihost logs --follow)")
            except MultihostError:
                pass  # the follower reports what the hosts do; a host gone is said there
        threading.Thread(target=one, name="stop-from-dashboard", daemon=True).start()

    def detach(self) -> None:
        self.detached = True


def _follow(cluster, record, pairs, listener, keys) -> int:
    from ..events import RunFinished
    from ..logs.follow import LogFollower

    follower = LogFollower(cluster, record.run_id, pairs, record.mirror_dir, listener,
                           follow=True).start()
    gone_on = (f"stopped following; run {record.run_id} goes on "
               f"(multihost stop {record.run_id} ends it)")
    try:
        while not follower.drain(timeout=0.5):
            if keys.detached:
                follower.stop()
                getattr(listener.view, "close", lambda: None)()
                print(f"multihost: {gone_on}", file=sys.stderr)
                return 0
    except KeyboardInterrupt:
        follower.stop()
        getattr(listener.view, "close", lambda: None)()
        print(f"\nmultihost: {gone_on}", file=sys.stderr)
        return 130
    follower.stop()
    _refuse_bad_replies(follower)
    status = _final_status(cluster, record, follower)
    listener(RunFinished(record.run_id, status.exit_code, status.root_cause, time=time.time(),
                         logs=record.log_dir))   # where the mirror is, as `run` says at its end
    return status.exit_code


def _final_status(cluster, record, follower):
    """The run's end as `run` would report it: the hosts' records reconciled, the first
    failure by time as the root cause (stopped nodes are not causes)."""
    from ..errors import MultihostError
    from ..run.control import query
    from ..run.outcome import status_of_node_records

    try:
        final = query(cluster, record).record
    except MultihostError:
        final = record
    if final.exit_code is not None:
        return final
    code = status_of_node_records(list(follower.final_states.values()))
    return dataclasses.replace(final, exit_code=code)
