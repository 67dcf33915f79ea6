"""The pure parts of the lab: names, addresses, the state-dir layout, and the text of
every file the lab writes (sshd_config, /etc/hosts, known_hosts, ssh config, hostfile).

Nothing here touches the system, so all of it is unit-tested without root.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

from ..errors import LabError

DEFAULT_NAME = "mhlab"
DEFAULT_ROOT = Path("/tmp/multihost-lab")
ENV_DIR = "MULTIHOST_LAB_DIR"
MAX_HOSTS = 64

# 198.18.0.0/15 is reserved for benchmarking (RFC 2544): it is never a real network, so a
# lab address can not shadow anything the machine talks to.
SUBNET = "198.18.0"
PREFIX_LEN = 24
CTL_ADDRESS = f"{SUBNET}.1"
BRIDGE = "br0"
HOST_IFACE = "eth0"
SSH_PORT = 22

# The host dirs that get a private copy in every host. A shared path below one of them
# would vanish inside the host, so it is bound back (see init.py).
HIDDEN_IN_HOSTS = ("/root", "/tmp", "/run", "/var/log", "/dev/shm")

# Inside a host, the private tmpfs /run keeps everything sshd rereads per connection.
HOST_RUN_DIR = "/run/multihost"
HOST_LOG_DIR = f"{HOST_RUN_DIR}/log"
HOST_KEY = f"{HOST_RUN_DIR}/ssh_host_ed25519_key"

# A lab name becomes part of namespace names (`<name>-h3`); no dash, so that the
# namespaces of lab `a` and lab `a-h1` can never be confused.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]{0,23}$")
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
# veth hands tbf 64 KiB GSO packets: a smaller bucket stalls the link (pitfall 6).
MIN_BURST = 256 * 1024


def check_name(name: str) -> str:
    if not _NAME_RE.match(name or ""):
        raise LabError(f"bad lab name {name!r}",
                       fix="use 1-24 letters, digits or '_', starting with a letter or digit")
    return name


def check_count(n: int) -> int:
    if not 1 <= n <= MAX_HOSTS:
        raise LabError(f"a lab has 1 to {MAX_HOSTS} hosts, not {n}", fix="pick N in 1..64")
    return n


def host_address(i: int) -> str:
    """Host i (1-based) lives at 198.18.0.(10+i)."""
    if not 1 <= i <= MAX_HOSTS:
        raise LabError(f"no host {i} in a lab", fix=f"hosts are numbered 1..{MAX_HOSTS}")
    return f"{SUBNET}.{10 + i}"


def host_name(i: int) -> str:
    return f"h{i}"


def ctl_netns(name: str) -> str:
    return f"{name}-ctl"


def host_netns(name: str, i: int) -> str:
    return f"{name}-h{i}"


# Fixed, locally administered MACs (02:...): the lab knows every host's link address, so
# it writes every neighbour table up front (see neighbour_lines) instead of letting 64
# hosts ARP for 63 peers at once through one kernel's bridge, a storm no real network of
# 64 machines suffers. The last byte is the address's last byte, so `ip neigh` reads easily.
MAC_PREFIX = "02:4d:48:00:00"


def host_mac(i: int) -> str:
    return f"{MAC_PREFIX}:{10 + i:02x}" if i else f"{MAC_PREFIX}:01"


def neighbour_lines(n: int, own: int, dev: str) -> List[str]:
    """`ip -b` lines giving host ``own`` (0: the controller) a permanent neighbour entry
    for every other member of an n-host lab, on interface ``dev``."""
    members = [(0, CTL_ADDRESS)] + [(i, host_address(i)) for i in range(1, n + 1)]
    return [f"neigh replace {address} lladdr {host_mac(i)} dev {dev} nud permanent"
            for i, address in members if i != own]


def bridge_port(i: int) -> str:
    """The bridge end (in the controller namespace) of host i's veth pair."""
    return f"vh{i}"


def netns_pattern(name: str) -> "re.Pattern[str]":
    return re.compile(rf"^{re.escape(name)}-(ctl|h[0-9]+)$")


def parse_rate(rate: str) -> Tuple[str, int]:
    """Check a tc rate ("1gbit", "100mbit", "50mbps"); return it and its tbf burst in bytes."""
    m = _RATE_RE.match((rate or "").strip().lower())
    if not m:
        raise LabError(f"bad rate {rate!r}", fix="write it as tc does, e.g. 1gbit, 100mbit, 50mbps")
    bits = float(m.group(1)) * _RATE_UNITS[m.group(2)]
    if bits < 8000:
        raise LabError(f"rate {rate!r} is too low to carry ssh", fix="use at least 1mbit")
    # One millisecond of traffic, never less than the veth GSO floor.
    burst = max(MIN_BURST, int(bits / 8 / 1000))
    return m.group(0), burst


def resolve_location(name: Optional[str], dir: Optional[str],
                     env: Optional[dict] = None) -> Tuple[Optional[str], Path]:
    """Where a lab lives: --dir, else the default dir of an explicit --name, else
    $MULTIHOST_LAB_DIR (set inside `lab exec`), else the default lab. The name is returned
    as given (None: read it from the state in the dir, or use the default)."""
    env = os.environ if env is None else env
    if dir:
        return name, Path(dir).absolute()
    if name:
        return name, DEFAULT_ROOT / check_name(name)
    if env.get(ENV_DIR):
        return None, Path(env[ENV_DIR]).absolute()
    return None, DEFAULT_ROOT / DEFAULT_NAME


@dataclass(frozen=True)
class LabPaths:
    """Every file of one lab, under its state dir."""

    dir: Path

    @property
    def state(self) -> Path:
        return self.dir / "lab.json"

    @property
    def hostfile(self) -> Path:
        return self.dir / "hosts.ini"

    @property
    def etc_hosts(self) -> Path:
        return self.dir / "etc" / "hosts"

    @property
    def resolv_conf(self) -> Path:
        return self.dir / "etc" / "resolv.conf"

    @property
    def home(self) -> Path:
        """The controller's HOME inside `lab exec`."""
        return self.dir / "ctl" / "home"

    @property
    def ctl_ssh(self) -> Path:
        return self.home / ".ssh"

    @property
    def cluster_key(self) -> Path:
        """The key pair every host holds, so hosts can ssh each other."""
        return self.dir / "keys" / "cluster_ed25519"

    def host(self, i: int) -> Path:
        return self.dir / "hosts" / host_name(i)

    def host_root(self, i: int) -> Path:
        return self.host(i) / "root"

    def host_tmp(self, i: int) -> Path:
        return self.host(i) / "tmp"

    def host_log(self, i: int) -> Path:
        """Bound at /run/multihost/log in the host: sshd.log, init.log, sshd.state."""
        return self.host(i) / "log"

    def host_boot(self, i: int) -> Path:
        """What init reads before it hides /tmp: its config, sshd_config, the host key."""
        return self.host(i) / "boot"

    # A Slurm lab (`lab up N --slurm`): the controller is a machine of its own (ctl) with
    # slurmctld; every host binds the same /etc/slurm and /etc/munge.
    @property
    def ctl(self) -> Path:
        return self.dir / "ctl"

    @property
    def ctl_log(self) -> Path:
        """The controller's /run/multihost/log: slurmctld.log, munged.log, init.log."""
        return self.ctl / "log"

    @property
    def ctl_boot(self) -> Path:
        return self.ctl / "boot"

    @property
    def slurm_etc(self) -> Path:
        """Bound at /etc/slurm on the controller and every host."""
        return self.dir / "slurm" / "etc"

    @property
    def munge_etc(self) -> Path:
        """Bound at /etc/munge: the lab's own munge.key."""
        return self.dir / "slurm" / "munge"


def sshd_config(i: int) -> str:
    return f"""\
# written by `multihost lab up` for {host_name(i)}
ListenAddress {host_address(i)}
Port {SSH_PORT}
HostKey {HOST_KEY}
PidFile none
PermitRootLogin prohibit-password
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
MaxStartups 200:30:400
MaxSessions 100
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
LogLevel INFO
"""


def etc_hosts(n: int) -> str:
    # No `127.0.1.1 <hostname>` line: gloo binds loopback when the hostname resolves to
    # 127.x, and ranks on other hosts are then refused (pitfall 7).
    lines = ["# written by `multihost lab up`: lab names only",
             "127.0.0.1\tlocalhost",
             "::1\tlocalhost ip6-localhost ip6-loopback",
             f"{CTL_ADDRESS}\tctl"]
    lines += [f"{host_address(i)}\t{host_name(i)}" for i in range(1, n + 1)]
    return "\n".join(lines) + "\n"


def resolv_conf() -> str:
    # Nothing listens there: a name that is not in the lab's /etc/hosts fails at once
    # instead of waiting on a DNS server the lab cannot reach.
    return "# written by `multihost lab up`\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


def known_hosts(n: int, host_pubkeys: Sequence[str]) -> str:
    """One line per host, naming it by address and by name."""
    lines = []
    for i in range(1, n + 1):
        key_type, key = host_pubkeys[i - 1].split()[:2]
        lines.append(f"{host_address(i)},{host_name(i)} {key_type} {key}")
    return "\n".join(lines) + "\n"


def ssh_client_config(ssh_dir: Path) -> str:
    return f"""\
# written by `multihost lab up`: the lab's own identity and host keys, never the user's
Host *
    User root
    IdentityFile {ssh_dir / 'id_ed25519'}
    IdentitiesOnly yes
    UserKnownHostsFile {ssh_dir / 'known_hosts'}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
"""


def hostfile(n: int, python: str) -> str:
    lines = ["# written by `multihost lab up`", "[defaults]", "user = root",
             f"python = {python}", "workdir = /root/work"]
    lines += [f"[{host_address(i)}]" for i in range(1, n + 1)]
    return "\n".join(lines) + "\n"


def share_paths(paths: Iterable[str]) -> List[str]:
    """Absolute, real, deduplicated share paths, parents before children, and only those
    a host would not see anyway (those under a dir the host gets a private copy of).
    A symlink is shared at both its own path and its target."""
    wanted = set()
    for p in paths:
        absolute = os.path.abspath(p)
        wanted.update({absolute, os.path.realpath(absolute)})
    hidden = [p for p in wanted
              if any(p == h or p.startswith(h + "/") for h in HIDDEN_IN_HOSTS)]
    result: List[str] = []
    for p in sorted(hidden, key=lambda s: (s.count("/"), s)):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in result):
            result.append(p)
    return result
