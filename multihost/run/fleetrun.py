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
    from ..host_parsing import parse_port

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
@dataclass(frozen=True)
class FleetrunLine:
    """fleetrun's own flags as typed (``multihost fleetrun`` builds it from its parser)."""

    script: str
    script_args: Tuple[str, ...] = ()
    ips: Optional[str] = None
    ips_alias: Optional[str] = None          # --cluster_node_ips
    gpus: Optional[str] = None
    gpus_alias: Optional[str] = None         # --selected_gpus, --devices
    hostfile: Optional[str] = None
    server_num: Optional[int] = None
    worker_num: Optional[int] = None
    heter_worker_num: Optional[str] = None
    servers: Optional[str] = None
    workers: Optional[str] = None
    heter_workers: Optional[str] = None
    http_port: Optional[int] = None

    def is_ps(self) -> bool:
        return any(value not in (None, "") for value in (
            self.server_num, self.worker_num, self.heter_worker_num, self.servers,
            self.workers, self.heter_workers, self.http_port))


@dataclass(frozen=True)
class FleetrunJob:
    """What a fleetrun line is as a ``multihost run``: its hosts, GPUs, command, launcher
    and, for a parameter-server job, the spec ``build_layout`` makes a layout of once the
    start port is known."""

    ips: Optional[str]
    gpus: Optional[str]
    gpus_from: Optional[str]                 # where the GPUs came from, for a fix's words
    command: Tuple[str, ...]
    launcher: str
    ps: Optional[tuple] = None


def _one_of(a: Optional[str], b: Optional[str], names: str) -> Optional[str]:
    if a is not None and b is not None and a != b:
        raise ConfigError(f"{names} both given, with different values",
                          fix=f"keep one of {names}")
    return a if a is not None else b


def job_from_fleetrun(line: FleetrunLine,
                      environ: Mapping[str, str] = os.environ) -> FleetrunJob:
    """The ``multihost run`` job of a fleetrun command line."""
    ips = _one_of(line.ips, line.ips_alias, "--ips and --cluster_node_ips")
    gpus = _one_of(line.gpus, line.gpus_alias, "--gpus and --selected_gpus/--devices")
    gpus_from = None
    if gpus is None and environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        # fleetrun's default: the cards CUDA_VISIBLE_DEVICES shows (the reference's
        # `export CUDA_VISIBLE_DEVICES=0,1,2,3; fleetrun train.py`), on every machine.
        gpus = environ["CUDA_VISIBLE_DEVICES"].strip()
        gpus_from = "CUDA_VISIBLE_DEVICES"   # a fix then says to unset it, not --gpus
    command = (line.script, *line.script_args)
    if not line.is_ps():
        return FleetrunJob(ips, gpus, gpus_from, command, "paddle")
    if line.heter_worker_num or line.heter_workers:
        raise ConfigError("heterogeneous parameter-server training (--heter_worker_num, "
                          "--heter_workers) is not run by multihost yet",
                          fix="run the CPU servers and trainers with --servers/--workers or "
                              "--server_num/--worker_num")
    if line.servers or line.workers:
        if not (line.servers and line.workers):
            raise ConfigError("--servers and --workers go together",
                              fix='give both, e.g. --servers="a:6170,b:6170" --workers="a,b"')
        if ips or line.hostfile:
            raise ConfigError("--servers/--workers name the machines already",
                              fix="leave out --ips and --hostfile (or use --ips with "
                                  "--server_num/--worker_num)")
        servers = _split(line.servers, "--servers", need_port=True)      # say a bad list now
        workers = _split(line.workers, "--workers", need_port=False)
        ips = ",".join(dict.fromkeys(h for h, _ in servers + workers))
        ps = ("lists", line.servers, line.workers, line.http_port)
    else:
        if not (line.server_num and line.worker_num):
            raise ConfigError("a parameter-server job needs servers and trainers",
                              fix="give both --server_num and --worker_num (per machine)")
        ps = ("counts", line.server_num, line.worker_num, line.http_port)
    return FleetrunJob(ips, gpus, gpus_from, command, "paddle_ps", ps)


def build_layout(spec: tuple, machines: Sequence[str], start_port: int) -> PsLayout:
    """The layout of ``run.ps`` once the machines' addresses and the start port are known."""
    if spec[0] == "lists":
        _, servers, workers, http = spec
        return layout_from_lists(servers, workers, start_port, http)
    _, server_num, worker_num, http = spec
    return layout_per_machine(machines, server_num, worker_num, start_port, http)
