"""The blueprint of a run: which host is which node, its ranks, address and interface,
and, once each host has been prepared, the exact launch request for it (argv and env).

Everything that can be wrong with the user's input is found in ``build_plan`` before
anything starts anywhere; ``launch_request`` can then no longer fail.
"""
from __future__ import annotations

import ipaddress
import os
import shlex
import socket
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from . import launchers as launch
from . import env as run_env
from ..errors import ConfigError
from ..hosts import Host
from ..job import JobOptions, in_place, workdir_for


IMAGE_PYTHON = "python3"


@dataclass(frozen=True)
class NodePlan:
    host: Host
    address: str                  # what the other hosts use to reach this one (an IP)
    nproc: int
    rank_offset: int              # global rank of local rank 0
    gpus: Tuple[int, ...]
    workdir: str                  # as configured; may start with ~/
    iface: Optional[str] = None   # from check or the hostfile; else found at prepare
    in_place: bool = False        # runs in the code directory itself (nothing synced)

    @property
    def node_rank(self) -> int:
        return self.host.rank


@dataclass(frozen=True)
class RunPlan:
    run_id: str
    template: launch.Template
    command: Tuple[str, ...]      # everything after --, verbatim
    no_python: bool
    start_port: int
    nodes: Tuple[NodePlan, ...]
    passed_env: Dict[str, str] = field(default_factory=dict)
    user_env: Dict[str, str] = field(default_factory=dict)
    kill_wait: float = 10.0
    allow_concurrent: bool = False
    attempt: int = 0              # 0, then 1, 2, ... when --max-restarts launches it again
    ps: Optional[Any] = None
    gpu_interval: float = 5.0     # seconds between a host's GPU samples; 0: none      # a fleetrun.PsLayout for a parameter-server job
    launch_timeout: float = 120.0  # a node not told that all launched by then stops itself
    name: str = ""                # --name: what people call the run (status --all, logs)
    container: Optional[Dict[str, Any]] = None   # --image: {image, engine, image_id, mounts}

    @property
    def world_size(self) -> int:
        return sum(node.nproc for node in self.nodes)

    @property
    def addresses(self) -> Tuple[str, ...]:
        return tuple(node.address for node in self.nodes)

    @property
    def master_addr(self) -> str:
        return self.nodes[0].address

    def display_command(self) -> str:
        words = run_env.mask_argv(self.command, self.user_env)
        return " ".join(shlex.quote(w) for w in words)


@dataclass(frozen=True)
class Prepared:
    """What a host answered to ``run.prepare``."""

    run_dir: str
    workdir: str
    interfaces: Dict[str, str]
    hostname: str = ""

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any]) -> "Prepared":
        return cls(reply["run_dir"], reply["workdir"], dict(reply.get("interfaces") or {}),
                   reply.get("hostname", ""))


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    return True


def resolve_address(host: Host, ssh_config_file: str = "~/.ssh/config") -> str:
    """The address other hosts reach this one at: the name if it is an IP, else the ssh
    config's HostName, else what the name resolves to here. Launchers need literal IPs
    (paddle matches its own address against --ips; a name could resolve to 127.0.1.1)."""
    if is_ip(host.name):
        return host.name
    from ..transport.ssh_login import load_ssh_config

    name = load_ssh_config(ssh_config_file).lookup(host.name).get("hostname", host.name)
    if is_ip(name):
        return name
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror:
        raise ConfigError(f"the name {name!r} does not resolve on the controller",
                          host=host.label,
                          fix="use its IP address in --ips or the hostfile") from None
    return infos[0][4][0]


def build_plan(run_id: str, hosts: Sequence[Host], job: JobOptions, template: launch.Template,
               command: Sequence[str], *, start_port: int, addresses: Sequence[str],
               ifaces: Sequence[Optional[str]] = (), no_python: bool = False,
               environ: Mapping[str, str] = {}, user_env: Mapping[str, str] = {},
               kill_wait: float = 10.0, allow_concurrent: bool = False,
               ps: Optional[Any] = None, gpu_interval: float = 5.0) -> RunPlan:
    if not command:
        raise ConfigError("no script given", fix="write it after --, e.g. "
                                                 "multihost run --ips=a,b -- train.py -c cfg.yml")
    if no_python and "script" in template.variables():
        raise ConfigError(f"the {template.name} launcher always runs a python script",
                          fix="drop --no-python, or use --launcher torchrun")
    nodes, offset = [], 0
    for i, host in enumerate(hosts):
        nproc = job.nproc_for(host)
        if ps is not None:  # a PS node's ranks are its trainers; ids follow the machines
            nproc = sum(1 for r in ps.on(ps.machines[i]) if r.role == "trainer")
            offset = ps.trainers_before(ps.machines[i]) if nproc else offset
        if start_port and start_port + nproc > 65535:
            # The node needs the rendezvous port and one per local trainer above it.
            raise ConfigError(f"start port {start_port} leaves no room for {nproc} trainer "
                              f"port(s) on {host.label} (the last would be {start_port + nproc})",
                              fix="pick a lower port, e.g. --start-port 17000")
        gpus = job.gpus_for(host)
        iface = (ifaces[i] if i < len(ifaces) else None) or host.iface
        nodes.append(NodePlan(host, addresses[i], nproc, offset, gpus,
                              workdir_for(host, job.code), iface, in_place(host, job.code)))
        offset += nproc
    return RunPlan(run_id, template, tuple(command), no_python, start_port, tuple(nodes),
                   run_env.passthrough(environ), dict(user_env), kill_wait, allow_concurrent,
                   ps=ps, gpu_interval=gpu_interval)


def check_script(command: Sequence[str], code_dir: str, *, no_python: bool) -> None:
    """The code directory must exist and the script after ``--`` be in it: a typo is found
    now, not after the check and the sync (or as an error on every host)."""
    if not os.path.isdir(code_dir):
        raise ConfigError(f"code directory {os.path.abspath(code_dir)} does not exist or is "
                          "not a directory",
                          fix="run from your project directory or give --code DIR")
    if no_python or not command:
        return
    script = command[0]
    if script.startswith("-") or script.startswith(("/", "~")) or not script.endswith(".py"):
        return  # `-m module`, a path on the hosts, or not a file we can judge
    if os.path.isfile(os.path.join(code_dir, script)):
        return
    raise ConfigError(f"script {script} is not in the code directory "
                      f"{os.path.abspath(code_dir)}",
                      fix="give its path relative to --code DIR (or pass --no-sync if the "
                          "hosts already have it)")


def template_values(plan: RunPlan, node: NodePlan, prepared: Prepared) -> Dict[str, Any]:
    # Inside an image the host's interpreter is not there: the image's python3 is.
    python = IMAGE_PYTHON if plan.container else node.host.python
    return {
        "python": python, "nnodes": str(len(plan.nodes)), "node_rank": str(node.node_rank),
        "nproc_per_node": str(node.nproc), "master_addr": plan.master_addr,
        "master_port": str(plan.start_port), "start_port": str(plan.start_port),
        "ips": ",".join(plan.addresses), "host_ip": node.address,
        "gpus": ",".join(str(g) for g in node.gpus), "world_size": str(plan.world_size),
        "rank_offset": str(node.rank_offset), "run_id": plan.run_id,
        "run_dir": prepared.run_dir, "log_dir": f"{prepared.run_dir}/log",
        "workdir": prepared.workdir, "script": plan.command[0],
        "program": launch.program_words(python, plan.command, plan.no_python),
        "script_args": list(plan.command[1:]),
        "rank_log": launch.rank_log_words(python, prepared.run_dir),
    }


def iface_of(node: NodePlan, prepared: Prepared) -> Optional[str]:
    """The interface for NCCL/gloo: check's (or the hostfile's), else the one that holds
    the node's address on the host."""
    if node.iface:
        return node.iface
    for name, address in sorted(prepared.interfaces.items()):
        if address == node.address:
            return name
    return None


def launch_request(plan: RunPlan, node: NodePlan, prepared: Prepared) -> Dict[str, Any]:
    """The ``run.launch`` request for one node (sent on stdin: it holds env values)."""
    values = template_values(plan, node, prepared)
    argv = launch.render(plan.template, values)
    env = run_env.node_env(
        plan.passed_env,
        run_env.multihost_env(plan.run_id, node.node_rank, plan.addresses, plan.start_port,
                              node.gpus, plan.attempt),
        launch.render_env(plan.template, values), plan.user_env, iface_of(node, prepared))
    masked_argv = run_env.mask_argv(argv, env)
    request = {
        "run_id": plan.run_id, "node_rank": node.node_rank, "argv": argv, "env": env,
        "cwd": prepared.workdir, "python": node.host.python,   # its directory leads PATH
        "in_place": node.in_place,
        "spawn": plan.template.spawn, "nproc": node.nproc,
        "rank_offset": node.rank_offset, "world_size": plan.world_size,
        "nnodes": len(plan.nodes), "master_addr": plan.master_addr,
        "master_port": plan.start_port, "grace": plan.kill_wait,
        "allow_concurrent": plan.allow_concurrent, "gpu_interval": plan.gpu_interval,
        "display": {"argv": masked_argv, "env": run_env.mask_env(env),
                    "command": launch.display_argv(masked_argv, prepared.run_dir)},
    }
    if plan.ps is not None:
        request["roles"] = ps_roles(plan, node, prepared)
    if plan.container:
        request["container"] = dict(plan.container)
    return request


def ps_roles(plan: RunPlan, node: NodePlan, prepared: Prepared) -> list:
    """Each server and trainer this node starts, with paddle's variables for it."""
    from .fleetrun import role_env

    layout = plan.ps
    return [{"role": role.role, "index": role.index, "local": role.local, "log": role.log_name,
             "env": role_env(layout, role, f"{prepared.run_dir}/gloo", node.gpus)}
            for role in layout.on(layout.machines[node.node_rank])]
