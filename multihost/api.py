"""The Python API: what ``import multihost`` gives a notebook, a sweep or a user's own tool.

    import multihost

    cluster = multihost.Cluster.from_hostfile("hosts.ini")
    report = cluster.check(nproc_per_node=2)
    run = cluster.run(["train.py", "--epochs", "3"], nproc_per_node=2)
    for event in run.events():
        ...
    result = run.wait()

The CLI is this API's first client: the same request and its checks
(``multihost.run.request``), the same typed results (CheckReport, SyncReport, RunStatus,
events) and the same errors (the ``MultihostError`` tree: one line each, naming the host,
the cause and the fix).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import ConfigError
from .fanout import DEFAULT_FANOUT, HostResult
from .fanout import HostGroup
from .host_parsing import parse_gpu_ids
from .hosts import Host, HostOptions, build_hosts, load_inventory
from .job import JobOptions, parse_nproc, parse_start_port, workdir_for
from .run.handle import Run, RunResult, notify
from .spares import spare_item
from .transport import SshOptions

__all__ = ["Cluster", "Run", "RunResult"]
Gpus = Union[None, str, Sequence[int]]
Spares = Union[None, str, Sequence[str]]


def _job(gpus: Gpus = None, nproc_per_node: Union[None, int, str] = None,
         start_port: Union[None, int, str] = None, data: Sequence[str] = (),
         code: str = ".") -> JobOptions:
    """JobOptions from Python values, checked by the same parsers as the CLI's flags."""
    if isinstance(gpus, str):
        gpus = parse_gpu_ids(gpus, "gpus")
    elif gpus is not None:
        gpus = parse_gpu_ids(",".join(str(g) for g in gpus), "gpus")
    nproc = parse_nproc(str(nproc_per_node)) if nproc_per_node is not None else None
    # None: FLAGS_START_PORT or 17000, as the CLI; "auto": the preflight picks a free range
    port = parse_start_port(None if start_port is None else str(start_port))
    return JobOptions(gpus=gpus, nproc_per_node=nproc, start_port=port, data=tuple(data),
                      code=code)


class Cluster:
    """Hosts in node-rank order (never sorted) and how to reach them.

    Build one with ``from_ips``, ``from_hostfile`` or ``local``; every method contacts
    all hosts at once and returns a typed result covering each of them."""

    def __init__(self, hosts: Sequence[Host], *, spares: Sequence[Host] = (),
                 connect_timeout: float = 10.0, accept_new_host_keys: bool = False,
                 ssh_config: str = "~/.ssh/config", fanout: int = DEFAULT_FANOUT,
                 host_options: HostOptions = HostOptions()):
        if not hosts:
            raise ConfigError("a cluster needs at least one host", fix="give ips or a hostfile")
        self.hosts = tuple(hosts)
        self.spares = tuple(spares)   # held back; each may take a lost host's node rank
        self.host_options = host_options   # what a spare named later is reached with
        self.hostfile: Optional[str] = None   # the hostfile read, if any: its spares' source
        self._listed_spares = tuple(spare_item(h) for h in self.spares)  # the others'
        self.ssh = SshOptions(connect_timeout=connect_timeout,
                              accept_new_host_keys=accept_new_host_keys, config_file=ssh_config)
        self.fanout = fanout

    @classmethod
    def from_ips(cls, ips: Union[str, Sequence[str]], *, spares: Spares = None,
                 user: Optional[str] = None, port: Optional[int] = None,
                 identity: Optional[str] = None, workdir: Optional[str] = None,
                 python: Optional[str] = None, **ssh) -> "Cluster":
        """``"a,b"`` or ``["a", "b"]``, as ``--ips`` takes them: ``[user@]host[:port]``;
        ``spares`` as ``--spares`` takes them."""
        options = HostOptions(user=user, port=port, identity_file=identity, workdir=workdir,
                              python=python)
        hosts, spare = load_inventory(_words(ips), None, options, _spare_entries(spares))
        return cls(hosts, spares=spare, host_options=options, **ssh)

    @classmethod
    def from_hostfile(cls, path: str, *, user: Optional[str] = None,
                      port: Optional[int] = None, identity: Optional[str] = None,
                      workdir: Optional[str] = None, python: Optional[str] = None,
                      **ssh) -> "Cluster":
        """An INI hostfile, as ``--hostfile`` reads it (docs/hostfile.md); its ``spare =
        true`` hosts become the cluster's spares."""
        options = HostOptions(user=user, port=port, identity_file=identity, workdir=workdir,
                              python=python)
        hosts, spares = load_inventory(None, path, options)
        cluster = cls(hosts, spares=spares, host_options=options, **ssh)
        # A rerun reads the hostfile's spares again, with their own settings, as the CLI's
        cluster.hostfile, cluster._listed_spares = os.path.abspath(os.path.expanduser(path)), ()
        return cluster

    @classmethod
    def local(cls, *, python: Optional[str] = None, workdir: Optional[str] = None) -> "Cluster":
        """This machine alone, without ssh (like the CLI with neither --ips nor --hostfile)."""
        return cls(load_inventory(None, None, HostOptions(python=python, workdir=workdir))[0])

    @classmethod
    def from_slurm(cls, *, transport: str = "srun", user: Optional[str] = None,
                   workdir: Optional[str] = None, python: Optional[str] = None,
                   **ssh) -> "Cluster":
        """Inside a Slurm allocation (salloc's shell, an sbatch script, or ``Cluster.slurm``):
        its nodes in Slurm's order, with the GPUs it gave each, reached as steps of the job
        as ``multihost`` reaches them there (``transport="ssh"``: the same nodes over ssh)
        (docs/slurm.md)."""
        from .slurm import plan, reached_by, with_allocation_gpus

        where = plan(None if transport == "srun" else transport, None, None)
        if where.allocation is None:
            raise ConfigError("Cluster.from_slurm takes the nodes of the Slurm allocation this "
                              "runs in, and there is none (no SLURM_JOB_ID)",
                              fix="run inside salloc or sbatch, or ask for one: "
                                  "with multihost.Cluster.slurm(2) as cluster: ...")
        options = HostOptions(user=user, workdir=workdir, python=python)
        hosts, _ = load_inventory(where.ips, None, options)
        hosts = with_allocation_gpus(hosts, where.allocation, where.transport)
        cluster = cls(hosts, host_options=options, **ssh)
        cluster.ssh = reached_by(where, cluster.ssh)
        return cluster

    @classmethod
    @contextlib.contextmanager
    def slurm(cls, nodes: int, *, partition: Optional[str] = None, time: Optional[str] = None,
              gres: Optional[str] = None, **options) -> Iterator["Cluster"]:
        """``run --slurm``'s allocation for a ``with`` block: Slurm is asked for ``nodes``
        (salloc; its queue's wait goes to the ``multihost`` logger), the block gets the
        ``Cluster.from_slurm`` of them (``options`` are its), and the allocation is released
        when the block is left, however it is left. Wait for your runs inside the block."""
        from .slurm.submit import Ask, in_allocation

        with in_allocation(Ask(nodes, partition, time, gres), notify):
            yield cls.from_slurm(**options)

    def _connect(self) -> HostGroup:
        return HostGroup(self.hosts, self.ssh, workers=self.fanout)

    def __repr__(self) -> str:
        return f"Cluster({', '.join(h.label for h in self.hosts)})"

    def fabric_group(self, *, serial: bool = False, config=None):
        """A fabric group of these hosts, in node-rank order, reached as multihost
        reaches them and with host keys checked alike (the extra ``multihost[fabric]``;
        docs/api.md, "Scripting hosts with fabric")."""
        from .transport.fabric_bridge import fabric_group

        return fabric_group(self.hosts, self.ssh.accept_new_host_keys, options=self.ssh,
                            serial=serial, config=config)

    def runs(self, *, ended: bool = False, mine: bool = False) -> list:
        """Every run on these hosts, of every user and controller, as ``status --all``
        lists them (registry/holders.py: SharedRun, the worst news first); ``ended``: the ended
        ones too; ``mine``: only those this user started."""
        from .registry.holders import chosen, gather
        from .registry.entry import controller

        with self._connect() as cluster:
            found, _ = gather(cluster)
        return chosen(found, ended=ended, mine=controller().partition("@")[0] if mine else None)

    def put(self, local: str, remote: str) -> list:
        """``local`` (a file or folder) to ``remote`` on every host, outside any run:
        rsync over ssh, as ``fetch`` (docs/api.md). A list of Copied, each ``.ok`` or
        with its ``.error`` and ``.fix``; ``remote`` is from the login's home."""
        from .copy import put

        return put(self.hosts, self.ssh, local, remote)

    def get(self, remote: str, local: str = ".", *, every_host: bool = False) -> list:
        """``remote`` from the first host into ``local``; ``every_host``: from each
        host into ``local/<host>/``. A list of Copied, as ``put``'s."""
        from .copy import get

        return get(self.hosts, self.ssh, remote, local, every_host)

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
        from .check.checks.workdir import refuse_unsafe_workdirs
        from .sync.pipeline import sync_code

        refuse_unsafe_workdirs(self.hosts, code)
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
            max_restarts: Optional[int] = None, spares: Spares = None,
            setup_always: bool = False, launch_timeout: float = 120.0,
            detach: bool = False, name: str = "", queue: bool = False,
            image: Optional[str] = None, engine: Optional[str] = None,
            image_from_controller: bool = False) -> "Run":
        """Check, sync and launch in ip order, as ``multihost run`` does; returns once every
        node has been launched (the preflight's or sync's failure is raised here). The run
        is followed in the background until it ends, unless ``detach``: then it goes on
        by itself, like ``run --detach``, and ``Run.events`` reattaches to it.
        ``max_restarts`` and ``spares`` (more, after the cluster's own) are the flags'
        (docs/longrun.md): each attempt's events end with its RunFinished. ``name`` is
        ``--name``'s: what the hosts' other users see; ``queue`` is ``--queue``'s: wait in
        line while the hosts are held, instead of refusing (docs/sharing.md). ``image``,
        ``engine`` and ``image_from_controller`` are ``--image``'s (docs/containers.md):
        every node's launcher and ranks run inside the image. ``setup_always`` and
        ``launch_timeout`` are ``--setup-always``'s and ``--launch-timeout``'s."""
        asked = {k: v for k, v in locals().items() if k not in ("self", "command")}  # the job file's
        from .run import request as run_request
        from .run.begin import begin
        from .registry.entry import check_name

        more = self._more_spares(spares)
        request = self._request(
            command, _job(gpus, nproc_per_node, start_port, data, code), env,
            launcher=launcher, no_python=no_python, check=check, sync=sync,
            allow_concurrent=allow_concurrent, log_dir=log_dir, kill_wait=kill_wait, wait=wait,
            detach=detach, setup=setup, setup_always=setup_always, hang_timeout=hang_timeout,
            gpu_interval=gpu_interval, max_restarts=max_restarts, spares=self.spares + more,
            launch_timeout=launch_timeout, name=check_name(name), queue=queue, image=image,
            engine=engine, image_from_controller=image_from_controller)
        validated = run_request.validate(self.hosts, request)   # before any host is asked
        cluster = self._connect()
        try:   # queue: in line until the hosts are free, as run --queue
            life = begin(cluster, request, validated, notify)
        except BaseException:
            cluster.close()
            raise

        def close() -> None:
            life.close()
            cluster.close()

        _keep_job(life.record.run_id, command, asked, self, more)
        run = Run(life.record.run_id)
        if detach:
            try:
                life.execute(lambda event: None)
            finally:
                close()
            return run
        run._attach(life, close)
        return run

    @classmethod
    def rerun(cls, run: Optional[str] = None, args: Optional[Sequence[str]] = None, *,
              env: Optional[Mapping[str, str]] = None, same_code: bool = False,
              detach: bool = False) -> "Run":
        """A recorded run (by id, prefix or name; None: the last one) started again, as
        ``multihost rerun RUN [-- ARGS]``: every key of its job file (docs/jobfile.md), read
        as the CLI reads it: its hosts as recorded, its spares, command, code directory,
        setup and options, the code as it is now; ``args`` replace its program's arguments
        (``["--resume", "ckpt/last.pt"]``); ``env`` gives its secrets again. Returns the
        new Run."""
        from .run.again import rerun_plan

        again = rerun_plan(run, args, dict(env or {}), same_code)
        cluster = cls(again.record.hosts, spares=again.spares, host_options=again.host_options,
                      **again.ssh)
        cluster.hostfile, cluster._listed_spares = again.hostfile, again.listed
        return cluster.run(again.command, detach=detach, **again.options)

    def _request(self, command: Sequence[str], job: JobOptions,
                 env: Optional[Mapping[str, str]], **options):
        """The RunRequest of ``run`` and ``scale``: the command as words, ``env`` checked
        as ``--env`` is."""
        from .run.env import check_user_env
        from .run.request import RunRequest

        if isinstance(command, str):
            raise ConfigError("command must be a list of words, e.g. ['train.py', '-c', 'cfg.yml']",
                              fix="split it: shlex.split(command)")
        gpus_given = any(job.gpus_for(h) for h in self.hosts)
        return RunRequest(command=tuple(command), job=job,
                          env=check_user_env((env or {}).items(), "env", gpus_given), **options)

    def _more_spares(self, spares: Spares) -> Tuple[Host, ...]:
        """Spares named for one run, reached as the cluster's hosts are; a spare that is
        one of the hosts is dropped where the pool is made (spares.spare_pool)."""
        entries = _spare_entries(spares)
        first = len(self.hosts) + len(self.spares)
        return tuple(dataclasses.replace(h, rank=first + i)
                     for i, h in enumerate(build_hosts(entries, self.host_options)))


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
        from .run import request as run_request
        from .scale.measure import MetricReader, parse_metric_is
        from .scale.plan import plan_counts
        from .scale.runner import ScaleOptions, scale_points
        from .scale.table import ScaleTable

        request = self._request(
            command, _job(gpus, nproc_per_node, start_port, data, code), env,
            launcher=launcher, no_python=no_python, check=check, sync=sync, log_dir=log_dir,
            kill_wait=kill_wait, setup=setup)
        options = ScaleOptions(plan_counts(len(self.hosts), counts), seconds, steps, metric,
                               parse_metric_is(metric_is))
        run_request.validate(self.hosts, request)
        points = scale_points(self.hosts, lambda hosts: HostGroup(hosts, self.ssh,
                                                                workers=self.fanout),
                              request, options)
        return ScaleTable(" ".join(command), MetricReader(metric).label, tuple(points))


def _keep_job(run_id: str, command: Sequence[str], asked: Mapping, cluster: Cluster,
              more_spares: Sequence[Host]) -> None:
    """The run's job file, as the CLI keeps one: what `rerun` and Cluster.rerun start."""
    from .run.again import cluster_table, job_table
    from .run.jobfile import dump
    from .run.records import save_job_file

    ssh = {"connect_timeout": cluster.ssh.connect_timeout,
           "accept_new_host_keys": cluster.ssh.accept_new_host_keys,
           "ssh_config": cluster.ssh.config_file, "fanout": cluster.fanout}
    listed = cluster._listed_spares + tuple(spare_item(h) for h in more_spares)
    reach = cluster_table(ssh, cluster.host_options, cluster.hostfile, listed)
    try:
        save_job_file(run_id, dump(job_table(command, asked, reach)))
    except (OSError, TypeError, ValueError) as err:   # the run itself goes on
        notify(f"warning: run {run_id}: its job file was not kept ({err}): it cannot be rerun")


def _words(items: Union[str, Sequence[str]]) -> str:
    return items if isinstance(items, str) else ",".join(items)


def _spare_entries(spares: Spares):
    """``spares`` ("a,b" or ["a", "b"], as ``--spares`` takes them) as host entries."""
    from .spares import parse_spares

    return parse_spares(_words(spares)) if spares is not None else ()
