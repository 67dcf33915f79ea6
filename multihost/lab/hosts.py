"""Per-host boot: keys, the files each host reads, starting the hosts, waiting for their
sshd, and driving a running host's sshd.

A host is `ip netns exec <lab>-hI unshare ... python init.py BOOT_JSON` (see init.py).
All hosts start from one shell that backgrounds them and exits, so they belong to no
caller (no zombie, no Ctrl-C from the terminal) and start in parallel.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..errors import LabError
from . import procs
from .config import (HOST_LOG_DIR, HOST_RUN_DIR, SSH_PORT, LabPaths, ctl_netns,
                     host_address, host_name, host_netns, sshd_config)

INIT = Path(__file__).with_name("init.py")
PROBE = Path(__file__).with_name("probe.py")
SSHD = "/usr/sbin/sshd"
UNSHARE = ["unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--mount-proc",
           "--propagation", "slave"]


def keygen(paths: Sequence[Path]) -> None:
    """ed25519 key pairs, all at once (one ssh-keygen each, in parallel)."""
    running = []
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        running.append((path, subprocess.Popen(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"multihost-lab {path.name}",
             "-f", str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)))
    for path, proc in running:
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise LabError(f"ssh-keygen failed for {path}: {err.strip()}",
                           fix="check that openssh-client is installed and the lab dir is writable")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def prepare(paths: LabPaths, i: int, cluster_pub: str, ctl_pub: str, known: str,
            shares: Sequence[str], binds: Sequence[Sequence[str]] = (),
            cgroups: Sequence[Sequence[str]] = ()) -> None:
    """Write host i's private dirs, its ~/.ssh and what its init reads at boot."""
    root, tmp = paths.host_root(i), paths.host_tmp(i)
    for d, mode in [(root, 0o700), (tmp, 0o1777), (paths.host_log(i), 0o755),
                    (paths.host_boot(i), 0o700), (root / ".ssh", 0o700), (root / "work", 0o755)]:
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, mode)
    ssh = root / ".ssh"
    # Every host holds the cluster key and trusts it, so hosts can ssh each other.
    _write(ssh / "id_ed25519", paths.cluster_key.read_text(), 0o600)
    _write(ssh / "id_ed25519.pub", cluster_pub, 0o644)
    _write(ssh / "authorized_keys", cluster_pub + ctl_pub, 0o600)
    _write(ssh / "known_hosts", known, 0o644)
    boot = paths.host_boot(i)
    _write(boot / "sshd_config", sshd_config(i), 0o600)
    boot_cfg = {
        "hostname": host_name(i), "address": host_address(i), "sshd": SSHD,
        "boot": str(boot), "root": str(root), "tmp": str(tmp), "log": str(paths.host_log(i)),
        "etc_hosts": str(paths.etc_hosts), "resolv_conf": str(paths.resolv_conf),
        "run_dir": HOST_RUN_DIR, "log_dir": HOST_LOG_DIR, "shares": list(shares),
        "binds": [list(b) for b in binds], "cgroups": [list(c) for c in cgroups],
    }
    _write(boot / "init.json", json.dumps(boot_cfg, indent=1) + "\n", 0o600)


def _boot_dir(paths: LabPaths, i: int) -> Path:
    return paths.ctl_boot if i == 0 else paths.host_boot(i)


def _log_dir(paths: LabPaths, i: int) -> Path:
    return paths.ctl_log if i == 0 else paths.host_log(i)


def launch(name: str, paths: LabPaths, indexes: Sequence[int]) -> Dict[int, procs.Proc]:
    """Start the hosts; return each host's init, by its real pid (pitfall 5: inside the
    PID namespace it is 1, so only the outside can record it). Index 0 is the controller
    machine of a Slurm lab, in the controller namespace."""
    lines = []
    for i in indexes:
        argv = ["ip", "netns", "exec", host_netns(name, i) if i else ctl_netns(name), *UNSHARE,
                sys.executable, str(INIT), str(_boot_dir(paths, i) / "init.json")]
        log = shlex.quote(str(_log_dir(paths, i) / "init.log"))
        lines.append(f"{shlex.join(argv)} </dev/null >>{log} 2>&1 &\necho {i} $!")
    out = subprocess.run(["sh", "-c", "\n".join(lines)], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, start_new_session=True, timeout=60)
    if out.returncode != 0:
        raise LabError(f"could not start the lab hosts: {out.stderr.strip()}",
                       fix="check that `ip` and `unshare` work as root")
    # `ip netns exec` execs unshare in place, and unshare forks the init: wait for it.
    outer = {int(i): int(pid) for i, pid in (line.split() for line in out.stdout.split("\n") if line)}
    inits: Dict[int, procs.Proc] = {}
    deadline = time.monotonic() + 10
    while len(inits) < len(outer):
        for parent, kids in procs.children(outer[i] for i in outer if i not in inits).items():
            i = next(k for k, v in outer.items() if v == parent)
            found = procs.proc(kids[0]) if kids else None
            if found:
                inits[i] = found
        if len(inits) == len(outer):
            break
        missing = sorted(set(outer) - set(inits))
        gone = [i for i in missing if not procs.running(outer[i])]
        if gone or time.monotonic() > deadline:
            missing = gone or missing
            raise LabError(f"host {host_name(missing[0]) if missing[0] else 'ctl'} did not start: "
                           f"{tail(_log_dir(paths, missing[0]) / 'init.log')}",
                           fix="check that `ip netns exec` and `unshare --pid --fork` work here")
        time.sleep(0.005)
    return inits


def tail(path: Path, lines: int = 1) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) if text else "(empty log)"


def sshd_state(paths: LabPaths, i: int) -> Optional[dict]:
    """What host i's init last wrote about its sshd, or None before the first write."""
    try:
        return json.loads((paths.host_log(i) / "sshd.state").read_text())
    except (OSError, ValueError):
        return None


def _failure(paths: LabPaths, i: int, inits: Dict[int, procs.Proc]) -> Optional[LabError]:
    # A failed `up` removes the lab dir, logs included: the error carries their last line.
    if not procs.alive(inits[i]):
        return LabError(f"host h{i} died while booting: {tail(paths.host_log(i) / 'init.log')}",
                        fix="that is the end of its init.log; check that unshare and mount work here")
    state = sshd_state(paths, i)
    if state is not None and not state.get("running"):
        return LabError(f"sshd of h{i} exited ({state.get('exit')}): "
                        f"{tail(paths.host_log(i) / 'sshd.log')}",
                        fix=f"that is the end of its sshd.log; check that `{SSHD} -t` passes")
    return None


def wait_sshd(name: str, paths: LabPaths, inits: Dict[int, procs.Proc],
              timeout: Optional[float] = None) -> None:
    """Return once every host's sshd accepts TCP, polled from inside the controller
    namespace; fail at once, with the host's log, when a host or its sshd dies."""
    # 64 hosts start 64 sshds on the machine's few cores, maybe beside other work: give
    # each host its share of time on top of a fixed base.
    timeout = 20.0 + 0.5 * len(inits) if timeout is None else timeout
    targets = [f"{host_address(i)}:{SSH_PORT}" for i in sorted(inits)]
    probe = subprocess.Popen(["ip", "netns", "exec", ctl_netns(name), sys.executable, str(PROBE),
                              str(timeout), *targets], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while probe.poll() is None:
            for i in sorted(inits):
                problem = _failure(paths, i, inits)
                if problem:
                    raise problem
            time.sleep(0.02)
    finally:
        if probe.poll() is None:
            probe.kill()
        out, _ = probe.communicate()
    if probe.returncode != 0:
        raise LabError(f"sshd did not come up in {timeout:g}s: {out.strip()}",
                       fix="is the machine overloaded? retry, or bring up fewer hosts")


def signal_init(init: procs.Proc, sig: int, i: int) -> None:
    if not procs.send(init, sig):
        raise LabError(f"host h{i} is not running", fix="bring the lab up again: multihost lab up N")


def wait_state(paths: LabPaths, i: int, running: bool, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = sshd_state(paths, i)
        if state is not None and bool(state.get("running")) == running:
            return
        time.sleep(0.01)
    word = "start" if running else "stop"
    raise LabError(f"sshd of h{i} did not {word} in {timeout:g}s: "
                   f"{tail(paths.host_log(i) / 'sshd.log')}", fix=f"see {paths.host_log(i)}")


def sshd_stop(paths: LabPaths, init: procs.Proc, i: int) -> None:
    """Stop only host i's sshd listener; open sessions and every job keep running."""
    signal_init(init, signal.SIGUSR2, i)
    wait_state(paths, i, running=False)


def sshd_start(name: str, paths: LabPaths, init: procs.Proc, i: int) -> None:
    signal_init(init, signal.SIGUSR1, i)
    wait_state(paths, i, running=True)
    wait_sshd(name, paths, {i: init})


def host_argv(init: procs.Proc, i: int, argv: Sequence[str]) -> List[str]:
    """Run argv inside host i, as its own processes would: its network, mounts (private
    /root, /tmp), PID namespace and hostname, from /root with HOME=/root."""
    if not procs.alive(init):
        raise LabError(f"host h{i} is not running", fix="bring the lab up again: multihost lab up N")
    return ["nsenter", "-t", str(init.pid), "-n", "-m", "-u", "-i", "-p", "--wd=/root", "--",
            "env", "-u", "MULTIHOST_LAB_DIR", "HOME=/root", *argv]
