"""Podman inside lab hosts (``lab up N --containers``), for ``run --image`` tests.

A lab host is a network, mount, UTS, IPC and PID namespace on one machine. For podman
to run containers in it, three things the machine has must be made the host's own:
  - the cgroup hierarchies: ``ip netns exec`` mounts a fresh /sys with none, and runc
    then fails (no cgroup mount found in mountinfo); init mounts the machine's again;
  - the container storage: /var/lib/containers is the machine's, and would be shared
    by every host; each host gets its own, bound there;
  - the engine's settings: runc (crun refuses a kernel with hybrid cgroups), the
    cgroupfs manager (no systemd in a lab host), events in a file (no journald). The
    lab's /etc/containers holds them, bound over the machine's in every host.
The controller (the machine itself) uses the same settings through CONTAINERS_CONF
and its own storage through CONTAINERS_STORAGE_CONF (``controller_env``).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Dict, List, Optional

from .config import CTL_ADDRESS, LabPaths

TOOLS = {"podman": "podman", "runc": "runc"}
CATATONIT = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit")
ENGINE_CONF = """[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


def unavailable() -> Optional[str]:
    """Why podman cannot run in lab hosts here, or None."""
    for tool, package in TOOLS.items():
        if not shutil.which(tool) and not os.access(f"/usr/sbin/{tool}", os.X_OK):
            return f"`{tool}` not found (apt-get install {package})"
    if not any(os.access(path, os.X_OK) for path in CATATONIT):
        return "podman's init (catatonit) not found (apt-get install catatonit)"
    if not cgroup_mounts():
        return "this machine mounts no cgroup hierarchy under /sys/fs/cgroup"
    return None


def cgroup_mounts(mounts_file: str = "/proc/self/mounts") -> List[List[str]]:
    """[fstype, options, target] of each cgroup hierarchy the machine mounts."""
    found = []
    for line in Path(mounts_file).read_text().splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("cgroup", "cgroup2"):
            continue
        if not fields[1].startswith("/sys/fs/cgroup"):
            continue
        options = ",".join(o for o in fields[3].split(",")
                           if o not in ("rw", "ro", "relatime", "nosuid", "nodev", "noexec"))
        found.append([fields[2], options, fields[1]])
    return found


def registry_address() -> str:
    """Where a lab's own registry listens (`docker-registry serve`, in the controller's
    namespace): the controller's lab address."""
    return f"{CTL_ADDRESS}:5000"


def registry_config(paths: LabPaths) -> Path:
    """A config for Debian's docker-registry: no auth, the lab's address, its own
    storage in the lab."""
    path = paths.dir / "containers" / "registry.yml"
    path.write_text(f"""version: 0.1
storage:
  filesystem:
    rootdirectory: {paths.dir / "containers" / "registry"}
  delete:
    enabled: true
http:
  addr: {registry_address()}
""")
    return path


def etc_dir(paths: LabPaths) -> Path:
    return paths.dir / "containers" / "etc"


def storage_dir(paths: LabPaths, i: int) -> Path:
    return paths.host(i) / "containers"


def controller_storage(paths: LabPaths) -> Path:
    return paths.dir / "containers" / "controller"


def prepare(paths: LabPaths, n: int) -> None:
    """The lab's /etc/containers (the machine's policy and registries, the lab's
    engine settings) and every host's storage."""
    etc = etc_dir(paths)
    etc.mkdir(parents=True, exist_ok=True)
    machine = Path("/etc/containers")
    for name in ("policy.json", "registries.conf"):
        if (machine / name).is_file():
            shutil.copy(machine / name, etc / name)
    if not (etc / "policy.json").exists():   # any image, no signature: a test lab
        (etc / "policy.json").write_text('{"default": [{"type": "insecureAcceptAnything"}]}\n')
    # A registry the lab runs itself listens on the controller's lab address, over plain
    # HTTP (no certificate to make): the hosts' pulls from it are allowed to be insecure.
    with open(etc / "registries.conf", "a") as conf:
        conf.write(f'\n[[registry]]\nlocation = "{registry_address()}"\ninsecure = true\n')
    (etc / "containers.conf").write_text(ENGINE_CONF)
    (etc / "storage.conf").write_text('[storage]\ndriver = "overlay"\n'
                                      'graphroot = "/var/lib/containers/storage"\n'
                                      'runroot = "/run/containers/storage"\n')
    for i in range(1, n + 1):
        storage_dir(paths, i).mkdir(parents=True, exist_ok=True)
    controller_storage(paths).mkdir(parents=True, exist_ok=True)
    (paths.dir / "containers" / "controller.conf").write_text(
        '[storage]\ndriver = "overlay"\n'
        f'graphroot = "{controller_storage(paths)}/storage"\n'
        f'runroot = "{controller_storage(paths)}/run"\n')


def binds(paths: LabPaths, i: int) -> List[List[str]]:
    return [[str(etc_dir(paths)), "/etc/containers"],
            [str(storage_dir(paths, i)), "/var/lib/containers"]]


def controller_env(paths: LabPaths) -> Dict[str, str]:
    """The environment under which this machine's podman is the lab controller's."""
    return {"CONTAINERS_CONF": str(etc_dir(paths) / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(paths.dir / "containers" / "controller.conf")}
