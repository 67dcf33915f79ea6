"""fleetrun's command line made into a multihost job: the collective form becomes a run
under paddle's launcher, the parameter-server form a PsLayout (which machine runs which
servers and trainers, on which ports) that multihost starts and supervises itself.

Paddle's own parameter-server launcher cannot be trusted to end a job (measured with
paddlepaddle 2.6.2): it exits 0 when every trainer crashed, leaves trainers waiting in the
gloo rendezvous forever when one dies at start-up, and leaves servers and trainers behind
when it is killed. So multihost starts each server and trainer itself, with exactly the
variables paddle's launcher gives them (``role_env``), and judges the job by its trainers.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError

SERVER, TRAINER = "server", "trainer"
LOG_PREFIX = {SERVER: "serverlog", TRAINER: "workerlog"}   # paddle's names, by role


@dataclass(frozen=True)
class PsRole:
    role: str             # SERVER or TRAINER
    index: int            # server index, or trainer id (PADDLE_TRAINER_ID)
    local: int            # its number among this machine's processes of the role (log N)
    address: str
    port: int

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def log_name(self) -> str:
        return f"{LOG_PREFIX[self.role]}.{self.local}"


@dataclass(frozen=True)
class PsLayout:
    machines: Tuple[str, ...]     # in node-rank order
    roles: Tuple[PsRole, ...]
    http_port: int

    def of(self, role: str) -> Tuple[PsRole, ...]:
        return tuple(r for r in self.roles if r.role == role)

    def on(self, address: str) -> Tuple[PsRole, ...]:
        return tuple(r for r in self.roles if r.address == address)

    def ports_per_machine(self) -> int:
        return max(len(self.on(m)) for m in self.machines)

    def first_servers(self) -> Tuple[int, ...]:
        """Per machine, the index of its first server (servers are numbered across the
        machines in order): what a server's lines are labelled by, not its log's N."""
        out, before = [], 0
        for machine in self.machines:
            out.append(before)
            before += sum(1 for r in self.on(machine) if r.role == SERVER)
        return tuple(out)

    def trainers_before(self, address: str) -> int:
        """Trainer id of the machine's first trainer (ids follow the machines' order)."""
        mine = [r.index for r in self.on(address) if r.role == TRAINER]
        return min(mine) if mine else len(self.of(TRAINER))


def _split(text: str, flag: str, need_port: bool) -> List[Tuple[str, Optional[int]]]:
    from ..hosts import parse_port

    items = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise ConfigError(f"{flag}: an empty entry in {text!r}",
                              fix=f"list entries like {flag}=10.0.0.1:6170,10.0.0.2:6170")
        host, colon, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not colon and need_port:
            raise ConfigError(f"{flag}: {item!r} has no port",
                              fix=f"write ip:port, e.g. {flag}={item}:6170")
        items.append((host, parse_port(port, flag) if colon else None))
    return items


def layout_from_lists(servers: str, workers: str, start_port: int,
                      http_port: Optional[int] = None) -> PsLayout:
    """``--servers ip:port,...`` and ``--workers ip[:port],...``: the machines are those
    named, in order of first appearance; a worker without a port takes the next free
    one from FLAGS_START_PORT on its machine."""
    server_items = _split(servers, "--servers", need_port=True)
    worker_items = _split(workers, "--workers", need_port=False)
    machines = list(dict.fromkeys(host for host, _ in server_items + worker_items))
    taken: Dict[str, set] = {m: set() for m in machines}
    for host, port in server_items + worker_items:
        if port is not None:
            if port in taken[host]:
                raise ConfigError(f"port {port} on {host} is given twice",
                                  fix="give every server and worker on a machine its own port")
            taken[host].add(port)
    next_port = {m: start_port for m in machines}

    def free_port(host: str) -> int:
        while next_port[host] in taken[host]:
            next_port[host] += 1
        taken[host].add(next_port[host])
        return next_port[host]

    ports = [(h, p) for h, p in server_items] + \
            [(h, p if p is not None else free_port(h)) for h, p in worker_items]
    roles = _number([(SERVER, h, p) for h, p in ports[:len(server_items)]] +
                    [(TRAINER, h, p) for h, p in ports[len(server_items):]], machines)
    http = http_port if http_port is not None else _http_port(roles, server_items[0][0],
                                                              start_port)
    return PsLayout(tuple(machines), roles, http)


def layout_per_machine(machines: Sequence[str], server_num: int, worker_num: int,
                       start_port: int, http_port: Optional[int] = None) -> PsLayout:
    """``--server_num S --worker_num W`` on each machine (fleetrun's single-machine form,
    on every host): servers on FLAGS_START_PORT and up, then the trainers."""
    entries = []
    for machine in machines:
        entries += [(SERVER, machine, start_port + i) for i in range(server_num)]
        entries += [(TRAINER, machine, start_port + server_num + j) for j in range(worker_num)]
    roles = _number(entries, list(machines))
    return PsLayout(tuple(machines), roles,
                    http_port if http_port is not None else start_port + server_num + worker_num)


def _http_port(roles: Sequence[PsRole], machine: str, start_port: int) -> int:
    """The gloo rendezvous port on the first server's machine: the first port from
    FLAGS_START_PORT that no role of that machine uses (one consistent range)."""
    used = {r.port for r in roles if r.address == machine}
    port = start_port
    while port in used:
        port += 1
    return port


def _number(entries: Sequence[Tuple[str, str, int]], machines: Sequence[str]) -> Tuple[PsRole, ...]:
    """Indexes as paddle gives them: machine by machine, in each in the order listed."""
    roles: List[PsRole] = []
    count = {SERVER: 0, TRAINER: 0}
    for machine in machines:
        local = {SERVER: 0, TRAINER: 0}
        for role, host, port in entries:
            if host != machine:
                continue
            roles.append(PsRole(role, count[role], local[role], host, port))
            count[role] += 1
            local[role] += 1
    return tuple(roles)


def role_env(layout: PsLayout, role: PsRole, gloo_dir: str,
             gpus: Sequence[int] = ()) -> Dict[str, str]:
    """What paddle 2.6's launcher (fleet/launch_utils.py, ParameterServerLauncher) sets
    for one server or trainer."""
    servers = ",".join(r.endpoint for r in layout.of(SERVER))
    trainers = ",".join(r.endpoint for r in layout.of(TRAINER))
    first_server = layout.of(SERVER)[0].address
    env = {
        "PADDLE_PSERVERS_IP_PORT_LIST": servers, "PADDLE_TRAINER_ENDPOINTS": trainers,
        "PADDLE_COORDINATOR_ENDPOINTS": "", "PADDLE_PORT": str(role.port),
        "TRAINING_ROLE": "PSERVER" if role.role == SERVER else "TRAINER",
        "PADDLE_TRAINERS_NUM": str(len(layout.of(TRAINER))), "POD_IP": role.address,
        "PADDLE_GLOO_RENDEZVOUS": "3", "PADDLE_GLOO_FS_PATH": gloo_dir,
        "PADDLE_GLOO_HTTP_ENDPOINT": f"{first_server}:{layout.http_port}",
    }
    if role.role == TRAINER:
        env["PADDLE_TRAINER_ID"] = str(role.index)
        env["FLAGS_selected_gpus"] = "0"
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(gpus[role.local % len(gpus)])
    return env


# -- the command line ---------------------------------------------------------------------
PS_FLAGS = ("server_num", "worker_num", "heter_worker_num", "servers", "workers",
            "heter_workers", "http_port")


def is_ps(args: argparse.Namespace) -> bool:
    return any(getattr(args, flag, None) not in (None, "") for flag in PS_FLAGS)


def _one_of(args, first: str, second: str, names: str):
    a, b = getattr(args, first), getattr(args, second)
    if a is not None and b is not None and a != b:
        raise ConfigError(f"{names} both given, with different values",
                          fix=f"keep one of {names}")
    return a if a is not None else b


def run_args_from_fleetrun(args: argparse.Namespace,
                           environ: Mapping[str, str] = os.environ) -> argparse.Namespace:
    """The ``multihost run`` arguments of a fleetrun command line (PS: with ``ps_layout``
    left to be built once the start port is known, see ``ps_request``)."""
    run = argparse.Namespace(**vars(args))
    run.ips = _one_of(args, "ips", "ips_alias", "--ips and --cluster_node_ips")
    run.gpus = _one_of(args, "gpus", "gpus_alias", "--gpus and --selected_gpus/--devices")
    if run.gpus is None and environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        # fleetrun's default: the cards CUDA_VISIBLE_DEVICES shows (the reference's
        # `export CUDA_VISIBLE_DEVICES=0,1,2,3; fleetrun train.py`), on every machine.
        run.gpus = environ["CUDA_VISIBLE_DEVICES"].strip()
        run.gpus_from = "CUDA_VISIBLE_DEVICES"   # a fix then says to unset it, not --gpus
    run.command = [args.training_script, *args.training_script_args]
    run.no_python = False
    run.ps = None
    if not is_ps(args):
        run.launcher = "paddle"
        return run
    if args.heter_worker_num or args.heter_workers:
        raise ConfigError("heterogeneous parameter-server training (--heter_worker_num, "
                          "--heter_workers) is not run by multihost yet",
                          fix="run the CPU servers and trainers with --servers/--workers or "
                              "--server_num/--worker_num")
    run.launcher = "paddle_ps"
    if args.servers or args.workers:
        if not (args.servers and args.workers):
            raise ConfigError("--servers and --workers go together",
                              fix='give both, e.g. --servers="a:6170,b:6170" --workers="a,b"')
        if run.ips or args.hostfile:
            raise ConfigError("--servers/--workers name the machines already",
                              fix="leave out --ips and --hostfile (or use --ips with "
                                  "--server_num/--worker_num)")
        _split(args.servers, "--servers", need_port=True)      # say a bad list now
        _split(args.workers, "--workers", need_port=False)
        run.ips = ",".join(dict.fromkeys(h for h, _ in _split(args.servers, "--servers", True) +
                                         _split(args.workers, "--workers", False)))
        run.ps = ("lists", args.servers, args.workers, args.http_port)
    else:
        if not (args.server_num and args.worker_num):
            raise ConfigError("a parameter-server job needs servers and trainers",
                              fix="give both --server_num and --worker_num (per machine)")
        run.ps = ("counts", args.server_num, args.worker_num, args.http_port)
    return run


def build_layout(spec: tuple, machines: Sequence[str], start_port: int) -> PsLayout:
    """The layout of ``run.ps`` once the machines' addresses and the start port are known."""
    if spec[0] == "lists":
        _, servers, workers, http = spec
        return layout_from_lists(servers, workers, start_port, http)
    _, server_num, worker_num, http = spec
    return layout_per_machine(machines, server_num, worker_num, start_port, http)
