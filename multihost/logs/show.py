"""A recorded run's logs, as ``multihost logs`` and ``Run.logs`` read them: the request
(``LogsRequest``), its filter checked against the run, the mirror brought up to date from
the hosts and read back, and the follow of a run still going (``RunLogs``).

Nothing here parses flags or draws: the caller picks the view and says the notes.
"""
from __future__ import annotations

import dataclasses
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

from ..errors import BadReply, ConfigError, MultihostError
from ..events import LogBlock, LogLine, LogProgress, RunFinished
from .follow import LogFollower
from .mirror_layout import nodes_of
from .mirror import LineFilter, parse_ranks, parse_since, read_mirror


@dataclass(frozen=True)
class LogsRequest:
    """Which lines of which run: ``multihost logs``' flags, ``Run.logs``' arguments."""

    run: Optional[str] = None                # a run id or its prefix; None: the last run
    ranks: Optional[str] = None              # "0,3", "0-7"
    hosts: Tuple[str, ...] = ()              # labels as shown, or bare names
    roles: Tuple[str, ...] = ()              # "server", "worker", "launcher"
    tail: Optional[int] = None               # the last N lines per rank
    grep: Optional[str] = None               # a regex a line must match
    since: Optional[str] = None              # an age, e.g. "15m"
    attempt: Optional[int] = None            # of a run with restarts (1: the first)
    follow: bool = False
    connect_timeout: float = 10.0
    ssh_config: str = "~/.ssh/config"


def line_filter(request: LogsRequest) -> LineFilter:
    """The lines asked for; a bad filter is the user's typo, said before any lookup."""
    if request.tail is not None and request.tail < 0:
        raise ConfigError("--tail must be 0 or more", fix="e.g. --tail 100")
    pattern = None
    if request.grep:
        try:
            pattern = re.compile(request.grep)
        except re.error as exc:
            raise ConfigError(f"--grep {request.grep!r} is not a valid regex: {exc}",
                              fix="check the pattern (Python regex syntax)") from None
    return LineFilter(ranks=parse_ranks(request.ranks) if request.ranks else None,
                      hosts=set(request.hosts) if request.hosts else None, pattern=pattern,
                      since=parse_since(request.since, time.time()) if request.since else None,
                      roles=set(request.roles) if request.roles else None)


def fit_to_run(keep: LineFilter, record, request: LogsRequest) -> LineFilter:
    """The filter checked against the run: a rank or host the run does not have would
    print nothing, silently, as if that rank had said nothing. Hosts may be named as
    shown (with a port) or by their bare name."""
    world = sum(record.nprocs)
    outside = sorted(r for r in keep.ranks or () if r >= world)
    if outside:
        raise ConfigError(f"--rank {request.ranks}: run {record.run_id} has no rank "
                          f"{outside[0]}: its ranks are 0-{world - 1}",
                          fix=f"pick ranks from 0-{world - 1}, e.g. --rank 0")
    if keep.hosts is None:
        return keep
    labels = {}
    for node in record.nodes:
        labels[node.label] = node.label
        labels.setdefault(str(node.host.get("name")), node.label)
    unknown = [h for h in request.hosts if h not in labels]
    if unknown:
        names = [node.label for node in record.nodes]
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} hosts)" if len(names) > 8 else "")
        raise ConfigError(f"--host {unknown[0]}: run {record.run_id} has no such host "
                          f"(its hosts: {shown})", fix="name one of its hosts, as listed")
    return dataclasses.replace(keep, hosts={labels[h] for h in request.hosts})


def earlier_attempt(record, request: LogsRequest, keep: LineFilter) -> Optional[Iterator[LogBlock]]:
    """The blocks of an earlier attempt (``request.attempt``), read from its mirror: over,
    and mirrored to its end before the next one started (the hosts' run directories hold
    the latest attempt); None when the attempt asked for is the latest."""
    from ..run.restarts import mirror_of

    mirror = mirror_of(record, request.attempt)
    if mirror == record.log_dir:
        return None
    if request.follow:
        raise ConfigError(f"--attempt {request.attempt} of run {record.run_id} has ended",
                          fix="drop --follow, or --attempt to follow the latest")
    return read_mirror(Path(mirror), nodes_of(_attempt_pairs(record, request.attempt)),
                       keep, tail=request.tail)


def _attempt_pairs(record, attempt):
    """(host, nproc) of an earlier attempt: a spare may have taken a rank since."""
    from ..run.records import host_from_dict

    hosts = record.attempts[attempt - 1].get("host_fields") or []
    if len(hosts) != len(record.nodes):
        return list(zip(record.hosts, record.nprocs))
    return list(zip([host_from_dict(h) for h in hosts], record.nprocs))


class Filtered:
    """Passes on the lines the user asked for, and every other event."""

    def __init__(self, view, keep: LineFilter):
        self.view = view
        self.keep = keep

    def __call__(self, event):
        if isinstance(event, LogBlock):
            event = self.keep.block(event)
            if event is not None:
                self.view(event)
        elif not isinstance(event, (LogLine, LogProgress)) or self.keep.accepts(event):
            self.view(event)


@dataclass(frozen=True)
class FollowEnd:
    """How following ended: the run's exit status, or the user left it running."""

    exit_code: int = 0
    detached: bool = False       # the dashboard's [d]
    interrupted: bool = False    # Ctrl-C


class RunLogs:
    """One recorded run's logs on its hosts: ``catch_up`` brings the mirror up to date,
    ``blocks`` reads it, ``follow`` streams the rest until the run ends. ``stop`` and
    ``detach`` are the dashboard's [s] and [d] while following."""

    def __init__(self, record, request: LogsRequest):
        from ..fanout import HostGroup
        from ..transport import SshOptions
        from ..transport.srun import from_record

        self.record, self.request = record, request
        self.pairs = list(zip(record.hosts, record.nprocs))
        options = from_record(record.ssh, SshOptions(connect_timeout=request.connect_timeout,
                                                     config_file=request.ssh_config))
        self.cluster = HostGroup(record.hosts, options)
        self.caught_up: Optional[LogFollower] = None
        self.detached = False

    def __enter__(self) -> "RunLogs":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.close()

    def catch_up(self) -> List[MultihostError]:
        """Every host's lines the mirror lacks, copied into it; the errors of hosts that
        could not be read (a host that is gone keeps what the mirror has)."""
        follower = LogFollower(self.cluster, self.record.run_id, self.pairs,
                               self.record.mirror_dir, lambda event: None, follow=False).start()
        follower.drain(timeout=max(30.0, self.request.connect_timeout * 2))
        follower.stop()
        self.caught_up = follower
        return [error for _, error in sorted(follower.errors.items())
                if not isinstance(error, BadReply)]

    def blocks(self, keep: LineFilter) -> Iterator[LogBlock]:
        return read_mirror(self.record.mirror_dir, nodes_of(self.pairs), keep,
                           tail=self.request.tail)

    def check_whole(self, say: Callable[[str], None]) -> None:
        """After the mirror was read: a host that broke the protocol, or lines the mirror
        could not keep, end the command with an error (what was shown is not whole)."""
        if self.caught_up is None:
            return
        refuse_bad_replies(self.caught_up, say)
        behind = [(rank, why) for rank, why in sorted(self.caught_up.mirror_behind.items())
                  if why]
        if behind and not self.request.follow:
            rank, why = behind[0]
            record = self.record
            raise MultihostError(f"the log mirror lacks lines the host still has ({why}); "
                                 f"the lines shown stop where it does",
                                 host=record.hosts[rank].label,
                                 fix=f"free space under {record.mirror_dir}, then run "
                                     f"`multihost logs {record.run_id}` again")

    def stop(self) -> None:
        """Stop the run on every host (as `multihost stop` would, recorded as a stop from
        the dashboard), in the background: the follow reports what the hosts do."""
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

    def follow(self, listener, say: Callable[[str], None]) -> FollowEnd:
        """Stream every new line to ``listener`` until the run ends (then its RunFinished,
        the end as `run` would report it), the user detaches, or Ctrl-C."""
        record = self.record
        follower = LogFollower(self.cluster, record.run_id, self.pairs, record.mirror_dir,
                               listener, follow=True).start()
        try:
            while not follower.drain(timeout=0.5):
                if self.detached:
                    follower.stop()
                    return FollowEnd(detached=True)
        except KeyboardInterrupt:
            follower.stop()
            return FollowEnd(interrupted=True, exit_code=130)
        follower.stop()
        refuse_bad_replies(follower, say)
        status = final_status(self.cluster, record, follower)
        listener(RunFinished(record.run_id, status.exit_code, status.root_cause,
                             time=time.time(), logs=record.log_dir))
        return FollowEnd(exit_code=status.exit_code)


def refuse_bad_replies(follower, say: Callable[[str], None]) -> None:
    """A host whose stream broke the protocol ends the command with an error naming it
    (the others' are said first): its lines stop at the last good frame."""
    bad = [error for _, error in sorted(follower.errors.items()) if isinstance(error, BadReply)]
    for error in bad[1:]:
        say(str(error))
    if bad:
        raise bad[0]


def final_status(cluster, record, follower):
    """The run's end as `run` would report it: the hosts' records reconciled, the first
    failure by time as the root cause (stopped nodes are not causes)."""
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


def read_logs(request: LogsRequest,
              say: Callable[[str], None] = lambda text: None) -> List[LogBlock]:
    """The lines of a recorded run that ``request`` asks for (``multihost logs`` without
    --follow): the mirror brought up to date from the hosts that answer (``say`` is told
    of each that did not), then read."""
    from ..run.records import load_run

    keep = line_filter(request)
    record = load_run(request.run)
    keep = fit_to_run(keep, record, request)
    blocks = earlier_attempt(record, request, keep)
    if blocks is not None:
        return list(blocks)
    with RunLogs(record, request) as logs:
        for error in logs.catch_up():
            say(f"{error} (the lines are the mirror's up to where it was reached)")
        found = list(logs.blocks(keep))
        logs.check_whole(say)
        return found
