"""The lab: N real SSH hosts on this machine, each a set of Linux namespaces.

    lab = Lab("mhlab")
    lab.up(4)                                  # h1..h4 at 198.18.0.11..14, sshd on each
    subprocess.run(lab.exec_argv(["ssh", "198.18.0.11", "hostname"]))   # prints h1
    lab.down()

Orchestration only: the file texts are in config.py, namespaces and links in netns.py,
per-host boot in hosts.py, the hosts' PID 1 in init.py. The state of a running lab is
<dir>/lab.json, so every command (and every process) can find it again.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

import multihost

from ..errors import LabError
from . import containers, hosts, netns, procs, slurm, users
from .config import (DEFAULT_NAME, LabPaths, check_count, check_name, ctl_netns,
                     etc_hosts, host_address, host_name, hostfile, known_hosts,
                     parse_rate, resolv_conf, resolve_location, share_paths, ssh_client_config)

TOOLS = {"ip": "iproute2", "unshare": "util-linux", "nsenter": "util-linux",
         "ssh-keygen": "openssh-client", "mount": "mount"}


@dataclass(frozen=True)
class HostStatus:
    index: int
    name: str
    address: str
    pid: Optional[int]      # the init's real pid, None if it is not running
    sshd: bool              # sshd is running in the host
    link: bool              # the host's cable is up


@dataclass(frozen=True)
class LabState:
    """What <dir>/lab.json holds: enough to find and tear down every piece."""
    name: str
    n: int
    rate: Optional[str] = None
    shares: List[str] = field(default_factory=list)
    python: str = ""
    inits: dict = field(default_factory=dict)  # "i" -> [pid, start time]; "0": ctl (Slurm)
    ready: bool = False                         # every sshd answered
    slurm: bool = False                         # slurmctld on ctl, slurmd on every host
    shared_user: str = ""                       # a user whose home every host shares


def _need_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, mounts, sshd)",
                       fix="run it as root, e.g. sudo multihost lab up 4")


def _which(tool: str) -> Optional[str]:
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


class Lab:
    def __init__(self, name: str = DEFAULT_NAME, dir: Optional[os.PathLike] = None):
        self.name = check_name(name)
        self.paths = LabPaths(Path(dir).absolute() if dir else resolve_location(name, None)[1])

    @classmethod
    def find(cls, name: Optional[str] = None, dir: Optional[str] = None) -> "Lab":
        """The lab the CLI means: see config.resolve_location; the name comes from the
        state in the dir when not given."""
        name, path = resolve_location(name, dir)
        if name is None:
            try:
                name = json.loads((path / "lab.json").read_text())["name"]
            except (OSError, ValueError, KeyError):
                name = DEFAULT_NAME
        return cls(name, path)

    # -- what tests and commands read ------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.paths.dir

    @property
    def hostfile(self) -> Path:
        return self.paths.hostfile

    @property
    def home(self) -> Path:
        return self.paths.home

    @property
    def n(self) -> int:
        return self.state().n

    def address(self, i: int) -> str:
        return host_address(i)

    def addresses(self) -> List[str]:
        return [host_address(i) for i in range(1, self.n + 1)]

    def state(self) -> LabState:
        try:
            return LabState(**json.loads(self.paths.state.read_text()))
        except (OSError, ValueError, TypeError):
            raise LabError(f"no lab {self.name!r} at {self.dir}",
                           fix=f"bring it up: multihost lab up N --name {self.name}")

    def _save(self, state: LabState) -> None:
        tmp = self.paths.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=1) + "\n")
        os.replace(tmp, self.paths.state)

    def _init(self, i: int) -> procs.Proc:
        _need_root()
        state = self.state()
        if not 1 <= i <= state.n:
            raise LabError(f"lab {self.name!r} has no host {i}", fix=f"hosts are 1..{state.n}")
        pid, start = state.inits.get(str(i), (0, 0))
        return procs.Proc(pid, start)

    # -- up / down -------------------------------------------------------------------
    def preflight(self, rate: Optional[str], with_slurm: bool = False) -> None:
        _need_root()
        needed = dict(TOOLS, **({"tc": "iproute2"} if rate else {}),
                      **(slurm.TOOLS if with_slurm else {}))
        for tool, package in needed.items():
            if not _which(tool):
                raise LabError(f"`{tool}` not found", fix=f"install {package}")
        if not os.access(hosts.SSHD, os.X_OK):
            raise LabError(f"{hosts.SSHD} not found", fix="install openssh-server")

    def up(self, n: int, rate: Optional[str] = None, shares: Sequence[str] = (),
           replace: bool = False, with_slurm: bool = False,
           shared_home: Optional[str] = None, sshfs: bool = False,
           with_containers: bool = False) -> LabState:
        """Bring up n hosts (with Slurm: see slurm.py; with ``shared_home``, that user's
        home is one directory on every host: users.py; with containers: podman in every
        host, containers.py); on any failure, tear down what
        was built and re-raise."""
        check_count(n)
        rate, burst = parse_rate(rate) if rate else (None, 0)
        self.preflight(rate, with_slurm)
        if with_containers and containers.unavailable():
            raise LabError(f"no podman in lab hosts: {containers.unavailable()}",
                           fix="apt-get install podman runc catatonit (scripts/setup.sh)")
        if self.exists():
            if not replace:
                raise LabError(f"lab {self.name!r} already exists ({self.dir})",
                               fix=f"multihost lab down --name {self.name}, or lab up --replace")
            self.down()
        if self.dir.exists() and any(self.dir.iterdir()):
            raise LabError(f"{self.dir} exists and is not a lab", fix="pick another --dir or --name")
        if shared_home:
            users.check_free(shared_home)   # never one that `down` would then remove
        try:
            return self._build(n, rate, burst, shares, with_slurm, shared_home, sshfs,
                               with_containers)
        except BaseException:
            try:
                self.down()
            except LabError:
                pass  # the first failure is the one worth reporting
            raise

    def exists(self) -> bool:
        return self.paths.state.exists() or bool(netns.lab_namespaces(self.name))

    def _build(self, n: int, rate: Optional[str], burst: int, shares: Sequence[str],
               with_slurm: bool = False, shared_home: Optional[str] = None,
               sshfs: bool = False, with_containers: bool = False) -> LabState:
        p = self.paths
        p.dir.mkdir(parents=True, exist_ok=True)
        if shared_home:
            users.shared_dir(p).mkdir(mode=0o755)
            shares = [*shares, str(users.shared_dir(p))]
        repo = str(Path(multihost.__file__).resolve().parent.parent)
        # The python that built the lab runs in the hosts too: share its venv, the real
        # interpreter the venv links to (pitfall 3) and the repo holding multihost.
        shared = share_paths([sys.prefix, sys.base_prefix, repo, *shares])
        state = LabState(self.name, n, rate, shared, sys.executable, slurm=with_slurm,
                         shared_user=shared_home or "")
        self._save(state)  # from here on, `down` knows this dir is a lab's

        ctl_key = p.ctl_ssh / "id_ed25519"
        p.ctl_ssh.mkdir(parents=True, exist_ok=True)
        os.chmod(p.ctl_ssh, 0o700)
        host_keys = [p.host_boot(i) / "ssh_host_ed25519_key" for i in range(1, n + 1)]
        hosts.keygen([p.cluster_key, ctl_key, *host_keys])
        netns.create(self.name, n, rate, burst)

        pubs = [Path(f"{k}.pub").read_text() for k in host_keys]
        known = known_hosts(n, pubs)
        p.etc_hosts.parent.mkdir(parents=True, exist_ok=True)
        p.etc_hosts.write_text(etc_hosts(n))
        p.resolv_conf.write_text(resolv_conf())
        (p.ctl_ssh / "known_hosts").write_text(known)
        (p.ctl_ssh / "config").write_text(ssh_client_config(p.ctl_ssh))
        os.chmod(p.ctl_ssh / "config", 0o600)
        cluster_pub = Path(f"{p.cluster_key}.pub").read_text()
        ctl_pub = Path(f"{ctl_key}.pub").read_text()
        binds = []
        if with_slurm:
            ctl_cfg = slurm.prepare(p, n)
            (p.ctl_boot / "init.json").write_text(json.dumps(ctl_cfg, indent=1) + "\n")
            binds = slurm.binds(p)
        cgroups = []
        if with_containers:
            containers.prepare(p, n)
            cgroups = containers.cgroup_mounts()
        for i in range(1, n + 1):
            own = containers.binds(p, i) if with_containers else []
            hosts.prepare(p, i, cluster_pub, ctl_pub, known, shared, [*binds, *own], cgroups)

        inits = hosts.launch(self.name, p, range(0 if with_slurm else 1, n + 1))
        state = dataclasses.replace(state, inits={str(i): [proc.pid, proc.start] for i, proc in inits.items()})
        self._save(state)
        ctl = inits.pop(0, None)
        hosts.wait_sshd(self.name, p, inits)
        if ctl:
            slurm.start(p, ctl, inits)
        p.hostfile.write_text(hostfile(n, sys.executable))
        if shared_home and sshfs:
            users.add_sshfs_user(p, shared_home, n, self.host_argv)
        elif shared_home:
            users.add_user(p, shared_home, n)
        state = dataclasses.replace(state, ready=True)
        self._save(state)
        return state

    def down(self) -> None:
        """Kill every process of the lab, delete its namespaces, remove its dir.
        Idempotent, and works on a half-built lab (no state, or only some namespaces)."""
        _need_root()
        namespaces = netns.lab_namespaces(self.name)
        try:
            recorded = [procs.Proc(pid, start) for pid, start in self.state().inits.values()]
        except LabError:
            recorded = []
        # Host inits first: SIGKILL to PID 1 of a host ends every process of that host.
        left = procs.kill_all(recorded)
        # Then anything else still inside a lab namespace (a half-built host, a `lab exec`).
        inodes = {procs.netns_inode(netns.netns_path(ns)) for ns in namespaces} - {None}
        mine = procs.ancestors()
        stray = [procs.proc(pid) for pid in procs.in_netns(inodes) if pid not in mine]
        left += procs.kill_all([s for s in stray if s])
        if left:
            raise LabError(f"process {left[0].pid} of lab {self.name!r} would not die",
                           fix=f"kill -9 {left[0].pid}, then multihost lab down again")
        netns.delete(namespaces)
        try:
            users.remove_user(self.state().shared_user)
        except LabError:
            pass   # no state: no user was made
        self._remove_dir()

    def _remove_dir(self) -> None:
        p = self.paths
        if not p.dir.exists():
            return
        # Mounts of the lab live in the hosts' mount namespaces (propagation slave,
        # pitfall 4), gone with the hosts; refuse to delete through one that leaked.
        prefix = str(p.dir) + "/"
        with open("/proc/self/mounts") as f:
            leaked = [line.split()[1] for line in f if line.split()[1].startswith(prefix)]
        if leaked:
            raise LabError(f"{leaked[0]} is still mounted", fix=f"umount -l {leaked[0]}")
        if not p.state.exists() and any(p.dir.iterdir()):
            raise LabError(f"{p.dir} is not a lab dir (no lab.json); not deleting it",
                           fix="remove it yourself if it is safe")
        shutil.rmtree(p.dir)

    # -- running commands --------------------------------------------------------------
    def exec_argv(self, argv: Sequence[str]) -> List[str]:
        """The argv that runs ``argv`` as the lab's controller: in the controller
        namespace, HOME=<dir>/ctl/home, the lab's ~/.ssh bound over the user's own (OpenSSH
        reads the passwd home, paramiko reads $HOME: pitfall 2), the lab's /etc/hosts, and
        this python's bin dir first on PATH (so `multihost` is this multihost)."""
        _need_root()
        if not os.path.exists(netns.netns_path(ctl_netns(self.name))):
            raise LabError(f"lab {self.name!r} is not up", fix=f"multihost lab up N --name {self.name}")
        p = self.paths
        user_ssh = os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".ssh")
        script = ('set -e; [ -d "$2" ] || mkdir -m 700 "$2"; mount --bind "$1" "$2"; '
                  'mount --bind "$3" /etc/hosts; mount --bind "$4" /etc/resolv.conf 2>/dev/null || true; '
                  'export HOME="$5" MULTIHOST_LAB_DIR="$6" PATH="$7:$PATH"; shift 7; exec "$@"')
        enter = ["ip", "netns", "exec", ctl_netns(self.name)]
        ctl = self.state().inits.get("0")
        if ctl:
            # A Slurm lab: be on the machine ctl (its hostname, /run with munged's socket,
            # /etc/slurm), in this PID namespace: a /proc of our own, mounted first.
            if not procs.alive(procs.Proc(*ctl)):
                raise LabError(f"the controller machine of lab {self.name!r} is not running",
                               fix=f"bring the lab up again: multihost lab up N --slurm --replace --name {self.name}")
            # nsenter would start in ctl's cwd (/): the caller's carries over, as it does
            # through `ip netns exec`.
            enter = ["sh", "-c", f'exec nsenter -t {ctl[0]} -n -m -u --wd="$(pwd -P)" -- "$@"',
                     "multihost-lab-enter"]
            script = "mount -t proc proc /proc; " + script
        return [*enter, "unshare", "--mount",
                "--propagation", "slave", "sh", "-c", script, "multihost-lab-exec",
                str(p.ctl_ssh), user_ssh, str(p.etc_hosts), str(p.resolv_conf), str(p.home),
                str(p.dir), os.path.dirname(sys.executable), *argv]

    def host_argv(self, i: int, argv: Sequence[str]) -> List[str]:
        return hosts.host_argv(self._init(i), i, argv)

    # -- faults ------------------------------------------------------------------------
    def cut(self, i: int) -> None:
        self._init(i)
        netns.set_link(self.name, self.n, i, up=False)

    def heal(self, i: int) -> None:
        self._init(i)
        netns.set_link(self.name, self.n, i, up=True)

    def shape(self, i: int, rate: Optional[str]) -> None:
        """Host i's link alone at ``rate`` in both directions (its eth0 and its bridge
        port), or back to the lab's own rate (``None``)."""
        self._init(i)
        own = self.state().rate
        netns.shape(self.name, i, *(parse_rate(rate) if rate else
                                    parse_rate(own) if own else (None, 0)))

    def sshd_stop(self, i: int) -> None:
        hosts.sshd_stop(self.paths, self._init(i), i)

    def sshd_start(self, i: int) -> None:
        hosts.sshd_start(self.name, self.paths, self._init(i), i)

    def slurm_nodes(self) -> dict:
        """{node: state} as the lab's slurmctld sees them (sinfo), {} without Slurm."""
        ctl = self.state().inits.get("0")
        if not ctl or not procs.alive(procs.Proc(*ctl)):
            return {}
        return slurm.node_states(procs.Proc(*ctl))

    def status(self) -> List[HostStatus]:
        state = self.state()
        links = netns.link_states(self.name, state.n)
        rows = []
        for i in range(1, state.n + 1):
            init = self._init(i)
            up = procs.alive(init)
            sshd = hosts.sshd_state(self.paths, i) or {}
            rows.append(HostStatus(i, host_name(i), host_address(i), init.pid if up else None,
                                   up and bool(sshd.get("running")), links.get(i, False)))
        return rows
