"""The Python API's handle on one run (``multihost.Run``): started by this process
(``Cluster.run``, followed in a background thread, restarts and spares included) or found
by id (``Run.load``), with its events, its end, its status and a way to stop it.

A run this process follows ends with the process, as the CLI's does: a Ctrl-C in
``events()``/``lines()``/``wait()``, the end of a ``with`` block, and the script's exit
stop it on every host and wait until it ended there (``detach=True`` runs go on by
themselves). The follower is a daemon thread that dies with the interpreter; an atexit
hook, which runs while daemon threads still do, ends what is left first.
"""
from __future__ import annotations

import atexit
import collections
import logging
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Deque, Iterator, List, Optional, Sequence, Tuple, Union

from ..errors import MultihostError, RunFailed
from ..events import LogBlock, LogLine, RootCause, RunFinished

EVENT_BUFFER = 100_000   # events kept for a reader that has not caught up (the mirror keeps all)
STOP_MARGIN = 30.0       # beyond the kill wait: the hosts' answers, the record saved
log = logging.getLogger("multihost")
_FOLLOWED: "weakref.WeakSet[Run]" = weakref.WeakSet()   # runs this process follows, live


def notify(text: str) -> None:
    """multihost's one-line progress notes (a spare that took a rank, a restart), for a
    program's own logging: warnings as warnings, the rest as info."""
    (log.warning if text.startswith("warning:") else log.info)(text)


@dataclass(frozen=True)
class RunResult:
    """How a run ended: ``exit_code`` as ``multihost run`` would exit, the root cause."""

    run_id: str
    exit_code: int
    root_cause: Optional[RootCause] = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Run:
    """A run, started by this process (``Cluster.run``) or found by id (``Run.load``)."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self._events: Deque[object] = collections.deque(maxlen=EVENT_BUFFER)
        self._ready = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._holder: dict = {}
        self._result: Optional[RunResult] = None
        self._error: Optional[BaseException] = None
        self._cannot_restart: Optional[RunFailed] = None

    @classmethod
    def load(cls, run_id: Optional[str] = None) -> "Run":
        """A run this controller recorded: by id or unique prefix; None is the last one."""
        from .records import load_run

        return cls(load_run(run_id).run_id)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r})"

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, kind, error, trace) -> None:
        """Leaving the block ends a run this process follows (``wait()`` inside it to let
        the job finish); a run found by id or started detached is left as it is."""
        if self._thread is not None and not self._done():
            self._end_here("the with block of the multihost API was left")

    @property
    def record(self):
        """The controller's record of the run (RunRecord), as last saved."""
        from .records import load_run

        return load_run(self.run_id)

    # -- a run followed by this process ---------------------------------------------
    def _attach(self, life, close) -> None:
        """Follow the run in a thread: every attempt (``--max-restarts``, spares) through
        the CLI's own loop (``Lifecycle.run_to_end``), each event into the queue; ``close``
        the clusters at the end."""
        def listen(event: object) -> None:
            if isinstance(event, RunFinished):   # its root cause carries the log's tail
                self._result = RunResult(self.run_id, event.exit_code, event.root_cause)
            with self._ready:
                self._events.append(event)
                self._ready.notify_all()

        def run_to_end() -> None:
            try:
                life.run_to_end(lambda: listen, self._holder)
            except RunFailed as err:  # no next attempt could start: the last one's end stands
                notify(f"warning: {err}")
                self._cannot_restart = err
            except BaseException as err:  # handed to the reader, raised there
                self._error = err
            finally:
                close()
                with self._ready:
                    self._ready.notify_all()

        self._thread = threading.Thread(target=run_to_end, name=f"multihost-run-{self.run_id}",
                                        daemon=True)
        self._thread.start()
        _FOLLOWED.add(self)

    def _end_here(self, why: str) -> None:
        """Stop on every host and wait for it (a second Ctrl-C meanwhile kills at once)."""
        controls = self._holder.get("controls")
        if controls is None or self._done():
            return
        controls.stop(f"{why} (pid {os.getpid()})")
        try:
            self._thread.join(self._stop_wait())
        except KeyboardInterrupt:
            controls.stop()          # the second: SIGKILL now, as the CLI's second Ctrl-C
            self._thread.join(STOP_MARGIN)
            raise

    def _stop_wait(self) -> float:
        try:
            return self.record.kill_wait + STOP_MARGIN
        except MultihostError:
            return STOP_MARGIN

    def _done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def events(self) -> Iterator[object]:
        """Every event of the run as it happens (NodeChanged, LogBlock, RunFinished, ...),
        ending with RunFinished. A run not followed by this process is reattached to, as
        ``multihost logs --follow`` does. Ctrl-C while iterating stops the run on every
        host, as it does in the CLI."""
        if self._thread is None:
            yield from self._follow_elsewhere()
            return
        try:
            while True:
                with self._ready:
                    while not self._events and not self._done():
                        self._ready.wait(0.5)
                    if not self._events and self._done():
                        break
                    event = self._events.popleft()
                yield event
        except KeyboardInterrupt:
            self._end_here("Ctrl-C in the multihost API")
            raise
        if self._error is not None:
            raise self._error

    def lines(self) -> Iterator[LogLine]:
        """Only the log lines of every rank, one LogLine each."""
        for event in self.events():
            if isinstance(event, LogBlock):
                yield from event.split()
            elif isinstance(event, LogLine):
                yield event

    def wait(self, *, check: bool = False) -> RunResult:
        """Block until the run ended everywhere. With ``check``, a failed run raises the
        same RunFailed the CLI prints (root cause, host and fix)."""
        if self._thread is not None:
            try:
                while self._thread.is_alive():
                    self._thread.join(0.5)
                    with self._ready:
                        self._events.clear()   # nobody reads them: the mirror has the lines
            except KeyboardInterrupt:
                self._end_here("Ctrl-C in the multihost API")
                raise
            if self._error is not None:
                raise self._error
            result = self._result or RunResult(self.run_id, 1)   # detached from the dashboard
        else:
            result = None
            for event in self._follow_elsewhere():
                if isinstance(event, RunFinished):
                    result = RunResult(self.run_id, event.exit_code, event.root_cause)
        assert result is not None
        if check and not result.ok:
            raise self._cannot_restart or self._failure(result)
        return result

    def _failure(self, result: RunResult) -> MultihostError:
        cause = result.root_cause
        if cause is None:
            return RunFailed(f"run {self.run_id} ended with exit status {result.exit_code}",
                             exit_code=result.exit_code, fix=f"see `multihost status {self.run_id}`")
        where = f"rank {cause.rank}" if cause.rank is not None else f"node {cause.node_rank}"
        return RunFailed(f"run {self.run_id} failed: {where}: {cause.reason}", host=cause.host,
                         exit_code=result.exit_code, fix=f"multihost logs {self.run_id} --host {cause.host}")

    def _follow_elsewhere(self) -> Iterator[object]:
        """Reattach: mirror and pass on every line until every node ended, then the end."""
        import queue as _queue

        from ..logs.follow import LogFollower
        from .control import cluster_of, query

        record = self.record
        pairs = list(zip(record.hosts, record.nprocs))
        events: "_queue.Queue[object]" = _queue.Queue()
        with cluster_of(record) as cluster:
            follower = LogFollower(cluster, record.run_id, pairs, record.mirror_dir, events.put,
                                   follow=True).start()
            try:
                while True:
                    finished = follower.drain(timeout=0.5)
                    while not events.empty():
                        yield events.get_nowait()
                    if finished:
                        break
            finally:
                follower.stop()
            while not events.empty():
                yield events.get_nowait()
            final = query(cluster, record).record
        yield RunFinished(record.run_id, final.exit_code if final.exit_code is not None else 1,
                          final.root_cause)

    # -- asking and ending ------------------------------------------------------------
    def status(self):
        """Every node of the run, asked now (RunStatus), as ``multihost status``."""
        from .control import cluster_of, query

        record = self.record
        with cluster_of(record) as cluster:
            return query(cluster, record)

    def stop(self, *, grace: Optional[float] = None):
        """End the run on every host (SIGTERM, ``grace`` seconds, SIGKILL), returning once
        it ended there. A run followed by this process is stopped by its follower, which
        then records its end."""
        controls = self._holder.get("controls")
        if controls is not None and not self._done() and grace is None:
            self._end_here("stopped from the multihost API")
            return None
        import socket

        from .control import cluster_of, stop

        record = self.record
        reason = f"multihost API from {socket.gethostname()} (pid {os.getpid()})"
        with cluster_of(record) as cluster:
            return stop(cluster, record, record.kill_wait if grace is None else grace, reason)


    def logs(self, *, rank: Union[None, str, Sequence[int]] = None,
             host: Union[None, str, Sequence[str]] = None,
             role: Union[None, str, Sequence[str]] = None, tail: Optional[int] = None,
             grep: Optional[str] = None, since: Optional[str] = None,
             attempt: Optional[int] = None) -> List[LogBlock]:
        """The lines ``multihost logs`` shows (without ``--follow``; ``events()`` follows),
        as LogBlocks (``.split()``: one LogLine per line): the controller's mirror brought
        up to date from the hosts that answer, then read. The arguments are the flags':
        ``rank`` "0,3" or [0, 3], ``host`` a host or several, ``role`` "server", "worker" or
        "launcher", ``tail`` the last N lines per rank, ``grep`` a regex, ``since`` an age
        ("15m"), ``attempt`` one attempt of a run with restarts (1: the first). A host
        that cannot be reached is a warning on the ``multihost`` logger: its lines are
        the mirror's."""
        from ..logs.show import LogsRequest, read_logs

        def words(value) -> Tuple[str, ...]:
            return () if value is None else (value,) if isinstance(value, str) else tuple(value)

        ranks = rank if rank is None or isinstance(rank, str) else ",".join(map(str, rank))
        return read_logs(LogsRequest(run=self.run_id, ranks=ranks, hosts=words(host),
                                     roles=words(role), tail=tail, grep=grep, since=since,
                                     attempt=attempt),
                         lambda text: notify(f"warning: {text}"))

    def fetch(self, *paths: str, to: str = ".", every_host: bool = False):
        """Outputs back, as ``multihost fetch``: each PATH (relative to the run's workdir)
        from rank 0's host into ``to`` (``every_host``: from each host into
        ``to/<host>/``). A list of Fetched, each ``.ok`` or with its ``.error`` and ``.fix``."""
        from .fetch import fetch

        return fetch(paths, run=self.run_id, to=to, every_host=every_host)


@atexit.register
def _end_followed_runs() -> None:
    """The script ends while runs it follows still run: end them on every host first."""
    for run in list(_FOLLOWED):
        if run._thread is not None and not run._done():
            sys.stderr.write(f"multihost: the script ended: stopping run {run.run_id} on every "
                             f"host (cluster.run(..., detach=True) leaves a run running)\n")
            sys.stderr.flush()
            run._end_here("the script using the multihost API ended")
