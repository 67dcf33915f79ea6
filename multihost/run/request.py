"""What a run is asked and what it makes of it: the request (``RunRequest``), every
mistake in it found before a host is contacted (``validate``), the plan on the hosts
(``plan_for``), the first record, and the error a failed run ends with (``failure_of``).
The steps that use them, attempt after attempt, are ``lifecycle.py``'s.

Nothing here parses arguments or draws anything. A failure is raised as the error tree's
own error (ConfigError, RunFailed), caught once at the CLI.
"""
from __future__ import annotations

import dataclasses
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError, RunFailed
from ..remote.run.states import NO_SPACE
from ..hosts import Host
from ..job import JobOptions
from ..transport.srun import record_fields
from . import launchers, plan as run_plan
from .records import NodeRecord, RunRecord, host_to_dict


@dataclass(frozen=True)
class RunRequest:
    """Everything ``multihost run`` is asked to do, apart from where (the hosts)."""

    command: Tuple[str, ...]                 # after --, verbatim
    job: JobOptions
    launcher: Optional[str] = None           # a template name or file; None: chosen from
                                             # the hostfile, else the script's imports
    no_python: bool = False
    env: Mapping[str, str] = field(default_factory=dict)   # the user's --env / --env-file
    check: bool = True
    sync: bool = True
    allow_concurrent: bool = False
    log_dir: Optional[str] = "log"           # the mirror's parent; None: no mirror
    kill_wait: float = 10.0
    wait: Optional[float] = None             # end the run S seconds after a rank exits
    detach: bool = False
    setup: Optional[str] = None              # a shell command on every host before launch
    setup_always: bool = False               # even where it succeeded on the same code
    max_restarts: Optional[int] = None       # None: not given (with spares: one restart
                                             # per spare, for a lost host only)
    hang_timeout: Optional[float] = None
    gpu_interval: float = 5.0                # seconds between GPU samples; 0: none
    ps: Optional[Any] = None                 # fleetrun's parameter-server spec
    spares: Tuple[Host, ...] = ()            # hosts that may take a failed host's node rank
    name: str = ""                           # --name, shown to every user of the hosts
    queue: bool = False                      # --queue: wait for the hosts instead of busy
    launch_timeout: float = 120.0            # a node whose job has not started everywhere
                                             # by then (the controller was lost during the
                                             # launch) stops its ranks itself
    image: Optional[str] = None              # --image: every node's launcher and ranks run
                                             # inside it (docs/containers.md)
    engine: Optional[str] = None             # --engine podman|docker; None: the host's
    image_from_controller: bool = False      # --image-from-controller: save | load, no pull


@dataclass(frozen=True)
class Validated:
    """What the input makes of the job before any host is contacted."""

    choice: Any                              # launcher_choice.Choice: the template and why
    template: launchers.Template
    job: JobOptions                          # with what the launcher imports, PS ports


def validate(hosts: Sequence[Host], request: RunRequest) -> Validated:
    """Every mistake in the input, found before a host is contacted."""
    from .launcher_choice import choose_launcher

    if request.kill_wait < 0 or (request.wait is not None and request.wait < 0):
        raise ConfigError("--kill-wait and --wait take seconds, 0 or more", fix="e.g. --kill-wait 10")
    if request.hang_timeout is not None and request.hang_timeout <= 0:
        raise ConfigError("--hang-timeout takes seconds, more than 0", fix="e.g. --hang-timeout 600")
    if request.launch_timeout <= 0:
        raise ConfigError("--launch-timeout takes seconds, more than 0",
                          fix="e.g. --launch-timeout 300")
    if request.gpu_interval < 0:
        raise ConfigError("--gpu-interval takes seconds, 0 (no GPU samples) or more",
                          fix="e.g. --gpu-interval 5")
    check_image(request)
    if (request.max_restarts or 0) < 0:
        raise ConfigError("--max-restarts takes a count, 0 or more", fix="e.g. --max-restarts 3")
    if request.max_restarts and request.detach:
        raise ConfigError("--max-restarts needs this controller to follow the run, and "
                          "--detach leaves it", fix="drop --detach (or --max-restarts)")
    if request.log_dir:
        check_log_dir(request.log_dir)
    from ..check.checks.workdir import refuse_unsafe_workdirs

    refuse_unsafe_workdirs(hosts, request.job.code)
    command = list(request.command)
    choice = choose_launcher(command, request.job.code, no_python=request.no_python,
                             given=request.launcher,
                             hostfile=hosts[0].launcher if hosts else None)
    template = launchers.load_template(choice.name)
    # The preflight checks that every host has what the launcher imports (torchrun: torch).
    # In an image, the framework is the image's: the host's python is not the job's.
    job = dataclasses.replace(request.job, frameworks=() if request.image else template.frameworks,
                              image=request.image, engine=request.engine,
                              image_from_controller=request.image_from_controller)
    ps = ps_layout(request, [h.name for h in hosts], job.start_port or 17000)
    if ps is not None:  # the check then checks every role's port on every machine
        job = dataclasses.replace(job, nproc_per_node=ps.ports_per_machine())
    run_plan.build_plan("", hosts, job, template, command, start_port=job.start_port or 0,
                        addresses=[h.name for h in hosts], no_python=request.no_python, ps=ps)
    if request.sync:
        run_plan.check_script(command, job.code, no_python=request.no_python)
    return Validated(choice, template, job)


def check_image(request: RunRequest) -> None:
    if request.engine and not request.image:
        raise ConfigError("--engine chooses the engine of --image", fix="add --image IMAGE")
    if request.image_from_controller and not request.image:
        raise ConfigError("--image-from-controller sends the --image", fix="add --image IMAGE")
    if request.engine not in (None, "podman", "docker"):
        raise ConfigError(f"--engine {request.engine!r} is not podman or docker",
                          fix="--engine podman (or docker)")
    if request.image and request.ps is not None:
        raise ConfigError("--image does not run parameter-server jobs yet",
                          fix="drop --image, or run the trainers with `multihost run`")
    if request.image is not None and (not request.image.strip() or request.image.startswith("-")
                                      or any(c.isspace() for c in request.image)):
        raise ConfigError(f"--image {request.image!r} is not an image name",
                          fix="e.g. --image nvcr.io/nvidia/pytorch:24.05-py3")


def ps_layout(request: RunRequest, addresses, start_port):
    """A parameter-server job's layout for these addresses and start port; None for any
    other job."""
    if request.ps is None:
        return None
    from .fleetrun import build_layout

    return build_layout(request.ps, addresses, start_port)


def check_log_dir(text: str) -> None:
    """The log mirror's directory must be one this controller can create and write, known
    before anything starts: found after the launch, it left the job running unwatched."""
    import errno

    if text.startswith("-"):
        raise ConfigError(f"--log_dir {text} is not a directory name (it reads as an option "
                          "or standard output)", fix="give a directory, e.g. --log_dir ./log")
    path = os.path.abspath(os.path.expanduser(text))
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    fix = "give a directory you can write, e.g. --log_dir ./log"
    if not os.path.isdir(existing):
        where = "is" if existing == path else f"is inside {existing}, which is"
        raise ConfigError(f"--log_dir {text} {where} not a directory", fix=fix)
    problem = None
    if not os.access(existing, os.W_OK | os.X_OK):
        problem = os.strerror(errno.EACCES)
    elif os.statvfs(existing).f_flag & os.ST_RDONLY:
        problem = os.strerror(errno.EROFS)
    if problem:
        place = "" if existing == path else f" (in {existing})"
        raise ConfigError(f"--log_dir {text} cannot be written{place}: {problem}", fix=fix)
    from ..remote import owners

    if owners.is_system_dir(path):
        raise ConfigError(f"--log_dir {text} is a system directory: the run's logs would be "
                          "written among the system's files", fix=fix)
    unsafe = owners.why_unsafe(path)
    if unsafe:
        # Another account could swap the mirror's files or links under us.
        raise ConfigError(f"--log_dir {text} is not only yours: {unsafe}",
                          fix=owners.fix_for(path, unsafe))


def revision_in_background(code_dir: str):
    """The code's git revision (``sync.manifest.code_revision``) asked in a thread; call
    the result to wait for it: worth recording, not worth waiting for while hosts are
    contacted, and never a reason to fail (None, None when it cannot be had)."""
    from ..sync.manifest import code_revision

    box = {}

    def ask() -> None:
        try:
            box["value"] = code_revision(code_dir)
        except Exception:  # a revision is nice to record, never a reason to fail
            pass

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    return lambda: (thread.join(), box.get("value") or (None, None))[1]


def node_records(plan) -> Tuple[NodeRecord, ...]:
    """One pending record per node of the plan, in node-rank order."""
    return tuple(NodeRecord(n.node_rank, host_to_dict(n.host), n.host.label, n.address,
                            n.nproc, n.rank_offset, n.workdir) for n in plan.nodes)


def initial_record(plan, request: RunRequest, cluster, git) -> RunRecord:
    from .env import mask_argv

    nodes = node_records(plan)
    options = cluster.options
    log_dir = (os.path.join(os.path.abspath(os.path.expanduser(request.log_dir)), plan.run_id)
               if request.log_dir else "")
    return RunRecord(
        run_id=plan.run_id, created=time.time(), nodes=nodes,
        command=tuple(mask_argv(plan.command, plan.user_env)),
        launcher=plan.template.name, node0_argv="", start_port=plan.start_port,
        world_size=plan.world_size, git_commit=git[0], git_dirty=git[1],
        log_dir=log_dir, kill_wait=plan.kill_wait, allow_concurrent=plan.allow_concurrent,
        name=request.name,
        ssh={"connect_timeout": options.connect_timeout,
             "accept_new_host_keys": options.accept_new_host_keys,
             "config_file": options.config_file, **record_fields(options)},
        controller={"hostname": socket.gethostname(), "pid": os.getpid(), "cwd": os.getcwd()})


def plan_for(cluster, request: RunRequest, validated: Validated, report, run_id: str,
             start_port: int):
    """The plan on the cluster's hosts: node 0's address is the rendezvous, so a spare
    that took node 0 moves it."""
    hosts = cluster.hosts
    addresses = [(report.host_report(h).address if report and report.host_report(h) else None)
                 or run_plan.resolve_address(h, cluster.options.config_file) for h in hosts]
    ifaces = [report.iface_for(h) if report else None for h in hosts]
    plan = run_plan.build_plan(
        run_id, hosts, validated.job, validated.template, list(request.command),
        start_port=start_port, addresses=addresses, ifaces=ifaces, no_python=request.no_python,
        environ=os.environ, user_env=dict(request.env), kill_wait=request.kill_wait,
        allow_concurrent=request.allow_concurrent, gpu_interval=request.gpu_interval,
        ps=ps_layout(request, addresses, start_port))
    container = None
    if request.image:
        container = {"image": request.image, "engine": request.engine,
                     "mounts": [p for p in validated.job.data if p.startswith("/")]}
    return dataclasses.replace(plan, launch_timeout=request.launch_timeout, name=request.name,
                               container=container)


def failure_of(end, plan) -> Optional[RunFailed]:
    """The error ``multihost run`` ends with (``end``: its last attempt's AttemptEnd), or
    None when the run succeeded."""
    from .execute import STOP_FROM_DASHBOARD
    from .outcome import describe

    if end.exit_code == 0:
        return None
    lost = "".join(f"; {plan.nodes[r].host.label} was lost: its processes may still run "
                   f"(`multihost stop {plan.run_id}` when it is back)" for r in end.lost)
    if end.cause is not None:
        cause = end.cause
        if cause.kind == "slurm":   # the allocation is over: one line, its own fix
            return RunFailed(f"run {plan.run_id} ended: {cause.reason}", fix=cause.fix,
                             exit_code=end.exit_code)
        if NO_SPACE in (cause.detail or ""):
            host = plan.nodes[cause.node_rank].host.label
            return RunFailed(f"run {plan.run_id} failed: node {cause.node_rank}: {NO_SPACE} on "
                             f"{host}{lost}", host=host, fix=fix_for(cause, plan, end.run_dirs),
                             exit_code=end.exit_code)
        return RunFailed(f"run {plan.run_id} failed: {describe(cause)}{lost}", host=cause.host,
                         fix=fix_for(cause, plan, end.run_dirs), exit_code=end.exit_code)
    if end.interrupted:
        return RunFailed(f"run {plan.run_id} stopped on every host (interrupted){lost}",
                         exit_code=end.exit_code)
    if end.stop_reason == STOP_FROM_DASHBOARD:
        return RunFailed(f"run {plan.run_id} stopped on every host (from the dashboard){lost}",
                         exit_code=end.exit_code)
    return RunFailed(f"run {plan.run_id} was stopped{lost}", exit_code=end.exit_code,
                     fix=f"see `multihost status {plan.run_id}`")


# PyTorch Lightning (TorchElasticEnvironment.validate_settings) refuses a world size that
# is not its devices x num_nodes, in words multihost can turn into the flags to give.
LIGHTNING_WORLD = re.compile(r"You set `devices=(\d+)` and `num_nodes=(\d+)` in Lightning, but "
                             r"the product \(\d+ \* \d+\) does not match the world size \((\d+)\)")


def world_size_fix(tail, plan) -> Optional[str]:
    """The flags that give the world size a Lightning job asks for, from its refusal."""
    found = next((m for m in map(LIGHTNING_WORLD.search, tail) if m), None)
    if found is None:
        return None
    devices, num_nodes, world = (int(n) for n in found.groups())
    hosts = len(plan.nodes)
    nprocs = sorted({node.nproc for node in plan.nodes})
    started = f"{hosts} host{'s' if hosts != 1 else ''} x {'/'.join(map(str, nprocs))} process" \
              f"{'es' if nprocs != [1] else ''} = {world}"
    if num_nodes == hosts:
        return (f"Lightning asks devices={devices} x num_nodes={num_nodes} = {devices * num_nodes} "
                f"processes; multihost started {started}: give --nproc_per_node {devices} "
                f"(Lightning's devices, per host)")
    return (f"Lightning asks devices={devices} x num_nodes={num_nodes} = {devices * num_nodes} "
            f"processes; multihost started {started}: give {num_nodes} hosts and "
            f"--nproc_per_node {devices}, or set num_nodes={hosts} in the Trainer (its num_nodes "
            f"is the number of hosts)")


def fix_for(cause, plan, run_dirs: Optional[Mapping[int, str]] = None) -> str:
    """What to look at next, for the root cause's kind of failure. ``run_dirs``: each
    node's run directory as its host named it (a host sharing its home with others
    keeps its runs in ~/.multihost/hosts/<host>/runs/)."""
    run_dir = (run_dirs or {}).get(cause.node_rank) or f"~/.multihost/runs/{plan.run_id}"
    import signal

    from .outcome import known_fix

    node = plan.nodes[cause.node_rank]
    known = known_fix(cause.tail or ()) or world_size_fix(cause.tail or (), plan)
    if known:
        return known
    if NO_SPACE in (cause.detail or ""):
        return (f"free space on {node.host.label}: `df -h ~/.multihost` there; old runs' "
                f"directories go with `rm -rf {os.path.dirname(run_dir)}/<run id>`; then "
                f"`multihost rerun {plan.run_id}`")
    if cause.kind == "lost":
        return (f"check that {node.host.label} is up and reachable; then "
                f"`multihost stop {plan.run_id}` to clean up what may still run there")
    if cause.kind == "hang":
        return "every rank's stack was taken when it hung (the path above); look for the rank apart"
    if cause.kind == "wait":
        return "the other ranks did not finish in time: look for a hang in their logs"
    if cause.signal == signal.SIGKILL or cause.exit_code == 137:
        return (f"look for the OOM killer in `dmesg` on {node.host.label}; lower the batch "
                "size or the number of data-loader workers")
    if cause.kind == "server":
        return (f"read its log: multihost logs {plan.run_id} --host {node.host.label} "
                f"--role server")
    if cause.local_rank is not None:
        return (f"read its log: multihost logs {plan.run_id} --rank {cause.rank} "
                f"(on the host: {run_dir}/log/workerlog.{cause.local_rank})")
    return f"read the launcher's output: multihost logs {plan.run_id} --host {node.host.label}"
