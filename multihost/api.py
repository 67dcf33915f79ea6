"""The Python API: what ``import multihost`` gives a notebook, a sweep or a user's own tool.

    import multihost

    cluster = multihost.Cluster.from_hostfile("hosts.ini")
    report = cluster.check(nproc_per_node=2)
    run = cluster.run(["train.py", "--epochs", "3"], nproc_per_node=2)
    for event in run.events():
        ...
    result = run.wait()

The CLI is this API's first client: the same pipeline (``multihost.run.pipeline``), the same
typed results (CheckReport, SyncReport, RunStatus, events) and the same errors (the
``MultihostError`` tree: one line each, naming the host, the cause and the fix).
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Deque, Iterator, List, Mapping, Optional, Sequence, Union

from .errors import ConfigError, MultihostError, RunFailed
from .events import LogBlock, LogLine, RootCause, RunFinished
from .fanout import DEFAULT_FANOUT, HostResult
from .fanout import Cluster as _Fanout
from .hosts import Host, HostOptions, load_hosts, parse_gpus
from .job import JobOptions, parse_nproc, parse_start_port, workdir_for
from .transport import SshOptions

Gpus = Union[None, str, Sequence[int]]
EVENT_BUFFER = 100_000   # events kept for a reader that has not caught up (the mirror keeps all)


def _job(gpus: Gpus = None, nproc_per_node: Union[None, int, str] = None,
         start_port: Union[None, int, str] = None, data: Sequence[str] = (),
         code: str = ".") -> JobOptions:
    """JobOptions from Python values, checked by the same parsers as the CLI's flags."""
    if isinstance(gpus, str):
        gpus = parse_gpus(gpus, "gpus")
    elif gpus is not None:
        gpus = parse_gpus(",".join(str(g) for g in gpus), "gpus")
    nproc = parse_nproc(str(nproc_per_node)) if nproc_per_node is not None else None
    # None: FLAGS_START_PORT or 17000, as the CLI; "auto": the preflight picks a free range
    port = parse_start_port(None if start_port is None else str(start_port))
    return JobOptions(gpus=gpus, nproc_per_node=nproc, start_port=port, data=tuple(data),
                      code=code)


class Cluster:
    """Hosts in node-rank order (never sorted) and how to reach them.

    Build one with ``from_ips``, ``from_hostfile`` or ``local``; every method contacts
    all hosts at once and returns a typed result covering each of them."""

    def __init__(self, hosts: Sequence[Host], *, connect_timeout: float = 10.0,
                 accept_new_host_keys: bool = False, ssh_config: str = "~/.ssh/config",
                 fanout: int = DEFAULT_FANOUT):
        if not hosts:
            raise ConfigError("a cluster needs at least one host", fix="give ips or a hostfile")
        self.hosts = tuple(hosts)
        self.ssh = SshOptions(connect_timeout=connect_timeout,
                              accept_new_host_keys=accept_new_host_keys, config_file=ssh_config)
        self.fanout = fanout

    @classmethod
    def from_ips(cls, ips: Union[str, Sequence[str]], *, user: Optional[str] = None,
                 port: Optional[int] = None, identity: Optional[str] = None,
                 workdir: Optional[str] = None, python: Optional[str] = None,
                 **ssh) -> "Cluster":
        """``"a,b"`` or ``["a", "b"]``, as ``--ips`` takes them: ``[user@]host[:port]``."""
        text = ips if isinstance(ips, str) else ",".join(ips)
        options = HostOptions(user=user, port=port, identity_file=identity, workdir=workdir,
                              python=python)
        return cls(load_hosts(text, None, options), **ssh)

    @classmethod
    def from_hostfile(cls, path: str, *, user: Optional[str] = None,
                      port: Optional[int] = None, identity: Optional[str] = None,
                      workdir: Optional[str] = None, python: Optional[str] = None,
                      **ssh) -> "Cluster":
        """An INI hostfile, as ``--hostfile`` reads it (docs/hostfile.md)."""
        options = HostOptions(user=user, port=port, identity_file=identity, workdir=workdir,
                              python=python)
        return cls(load_hosts(None, path, options), **ssh)

    @classmethod
    def local(cls, *, python: Optional[str] = None, workdir: Optional[str] = None) -> "Cluster":
        """This machine alone, without ssh (like the CLI with neither --ips nor --hostfile)."""
        return cls(load_hosts(None, None, HostOptions(python=python, workdir=workdir)))

    def _connect(self) -> _Fanout:
        return _Fanout(self.hosts, self.ssh, workers=self.fanout)

    def __repr__(self) -> str:
        return f"Cluster({', '.join(h.label for h in self.hosts)})"

    def fabric_group(self, *, serial: bool = False, config=None):
        """A fabric group of these hosts, in node-rank order, reached as multihost
        reaches them and with host keys checked alike (the extra ``multihost[fabric]``;
        docs/api.md, "Scripting hosts with fabric")."""
        from .transport.fabric_bridge import fabric_group

        return fabric_group(self.hosts, self.ssh.accept_new_host_keys, options=self.ssh,
                            serial=serial, config=config)

    # -- commands -------------------------------------------------------------------
    def exec(self, command: str, *, timeout: Optional[float] = None) -> List[HostResult]:
        """A shell command on every host; a HostResult (value: CommandResult) per host."""
        with self._connect() as cluster:
            return cluster.map(lambda host, transport: transport.run(command, timeout=timeout))

    def check(self, *, gpus: Gpus = None, nproc_per_node=None, start_port=None,
              data: Sequence[str] = (), code: str = ".", timeout: float = 8.0):
        """The preflight of ``multihost check``: a CheckReport (``.ok``, per-host results)."""
        from .check.preflight import run_checks

        job = _job(gpus, nproc_per_node, start_port, data, code)
        with self._connect() as cluster:
            return run_checks(cluster, job, budget=timeout)

    def sync(self, code: str = ".", *, dry_run: bool = False, verify: bool = False):
        """The code directory made identical in every host's workdir: a SyncReport.
        Raises SyncError when a host could not be made identical."""
        from .sync.pipeline import sync_code

        workdirs = {host.rank: workdir_for(host, code) for host in self.hosts}
        with self._connect() as cluster:
            return sync_code(cluster, code, workdirs=workdirs, dry_run=dry_run, verify=verify)

    def run(self, command: Sequence[str], *, launcher: Optional[str] = None, gpus: Gpus = None,
            nproc_per_node=None, start_port=None,
            env: Optional[Mapping[str, str]] = None, code: str = ".", data: Sequence[str] = (),
            no_python: bool = False, check: bool = True, sync: bool = True,
            allow_concurrent: bool = False, log_dir: Optional[str] = "log",
            kill_wait: float = 10.0, wait: Optional[float] = None, setup: Optional[str] = None,
            hang_timeout: Optional[float] = None, gpu_interval: float = 5.0,
            detach: bool = False) -> "Run":
        """Check, sync and launch in ip order, as ``multihost run`` does; returns once every
        node has been launched (the preflight's or sync's failure is raised here). The run
        is followed in the background until it ends, unless ``detach``: then it goes on
        by itself, like ``run --detach``, and ``Run.events`` reattaches to it."""
        from .run import pipeline
        from .run.env import check_user_env

        if isinstance(command, str):
            raise ConfigError("command must be a list of words, e.g. ['train.py', '-c', 'cfg.yml']",
                              fix="split it: shlex.split(command)")
        job = _job(gpus, nproc_per_node, start_port, data, code)
        gpus_given = any(job.gpus_for(h) for h in self.hosts)
        user_env = check_user_env((env or {}).items(), "env", gpus_given)
        request = pipeline.RunRequest(
            command=tuple(command), job=job, launcher=launcher, no_python=no_python,
            env=user_env, check=check, sync=sync, allow_concurrent=allow_concurrent,
            log_dir=log_dir, kill_wait=kill_wait, wait=wait, detach=detach, setup=setup,
            hang_timeout=hang_timeout, gpu_interval=gpu_interval)
        cluster = self._connect()
        try:
            plan, record = pipeline.prepare(cluster, request)
        except BaseException:
            cluster.close()
            raise
        run = Run(record.run_id)
        if detach:
            try:
                pipeline.start(cluster, plan, record, lambda event: None, request)
            finally:
                cluster.close()
            return run
        run._attach(cluster, plan, record, request)
        return run


    def scale(self, command: Sequence[str], *, counts: Union[None, str, Sequence[int]] = None,
              seconds: Optional[float] = None, steps: Optional[int] = None,
              metric: Optional[str] = None, metric_is: str = "auto",
              launcher: Optional[str] = None, gpus: Gpus = None, nproc_per_node=None,
              start_port=None, env: Optional[Mapping[str, str]] = None, code: str = ".",
              data: Sequence[str] = (), no_python: bool = False, check: bool = True,
              sync: bool = True, log_dir: Optional[str] = "log", kill_wait: float = 10.0,
              setup: Optional[str] = None):
        """``multihost scale``: the job on 1, 2, 4, ... hosts and all (or ``counts``), each
        point an ordinary run; a ScaleTable (``.rows()``, ``.to_json()``) (docs/scale.md)."""
        from .run import pipeline
        from .run.env import check_user_env
        from .scale.measure import MetricReader, parse_metric_is
        from .scale.plan import plan_counts
        from .scale.runner import ScaleOptions, scale_points
        from .scale.table import ScaleTable

        if isinstance(command, str):
            raise ConfigError("command must be a list of words, e.g. ['train.py', '-c', 'cfg.yml']",
                              fix="split it: shlex.split(command)")
        job = _job(gpus, nproc_per_node, start_port, data, code)
        gpus_given = any(job.gpus_for(h) for h in self.hosts)
        request = pipeline.RunRequest(
            command=tuple(command), job=job, launcher=launcher, no_python=no_python,
            env=check_user_env((env or {}).items(), "env", gpus_given), check=check,
            sync=sync, log_dir=log_dir, kill_wait=kill_wait, setup=setup)
        options = ScaleOptions(plan_counts(len(self.hosts), counts), seconds, steps, metric,
                               parse_metric_is(metric_is))
        pipeline.validate(self.hosts, request)
        points = scale_points(self.hosts, lambda hosts: _Fanout(hosts, self.ssh,
                                                                workers=self.fanout),
                              request, options)
        return ScaleTable(" ".join(command), MetricReader(metric).label, tuple(points))


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
        self._plan = None

    @classmethod
    def load(cls, run_id: Optional[str] = None) -> "Run":
        """A run this controller recorded: by id or unique prefix; None is the last one."""
        from .run.records import load_run

        return cls(load_run(run_id).run_id)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r})"

    @property
    def record(self):
        """The controller's record of the run (RunRecord), as last saved."""
        from .run.records import load_run

        return load_run(self.run_id)

    # -- a run followed by this process ---------------------------------------------
    def _attach(self, cluster, plan, record, request) -> None:
        from .run import pipeline

        self._plan = plan

        def listen(event: object) -> None:
            if isinstance(event, RunFinished):   # its root cause carries the log's tail
                self._result = RunResult(self.run_id, event.exit_code, event.root_cause)
            with self._ready:
                self._events.append(event)
                self._ready.notify_all()

        def follow() -> None:
            try:
                pipeline.start(cluster, plan, record, listen, request, self._holder)
            except BaseException as err:  # handed to the reader, raised there
                self._error = err
            finally:
                cluster.close()
                with self._ready:
                    self._ready.notify_all()

        self._thread = threading.Thread(target=follow, name=f"multihost-run-{self.run_id}",
                                        daemon=True)
        self._thread.start()

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
            self.stop()
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
                self.stop()
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
            raise self._failure(result)
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

        from .logs.follow import LogFollower
        from .run.control import cluster_of, query

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
        from .run.control import cluster_of, query

        record = self.record
        with cluster_of(record) as cluster:
            return query(cluster, record)

    def stop(self, *, grace: Optional[float] = None):
        """End the run on every host (SIGTERM, ``grace`` seconds, SIGKILL). A run followed
        by this process is stopped by its follower, which then records its end."""
        controls = self._holder.get("controls")
        if controls is not None and not self._done() and grace is None:
            controls.stop()
            return None
        import os
        import socket

        from .run.control import cluster_of, stop

        record = self.record
        reason = f"multihost API from {socket.gethostname()} (pid {os.getpid()})"
        with cluster_of(record) as cluster:
            return stop(cluster, record, record.kill_wait if grace is None else grace, reason)

