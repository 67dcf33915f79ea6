"""End-to-end fixtures: one real lab (4 hosts with sshd, in Linux namespaces) per test
session, shared by every test under tests/lab/.

    def test_hostname(lab):
        r = lab.ssh(1, "hostname")                         # real OpenSSH, as the controller
        assert r.stdout.strip() == "h1"
        r = lab.multihost("exec", "--hostfile", str(lab.hostfile), "--", "hostname")
        with lab.cut_link(2):                              # healed again on exit
            ...
        with lab.sshd_stopped(3):                          # sshd restarted on exit
            ...

Every test here is marked ``lab`` (``pytest -m "not lab"`` skips them). The lab is
skipped only where it can not exist (not root, no sshd or iproute2); CI runs as root
with all of it, so there the lab tests always run.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import pytest

from multihost.lab import Lab

HOSTS = 4
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def lab_unavailable() -> Optional[str]:
    """Why a lab can not be built on this machine, or None."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, mounts, sshd)"
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    for tool in ["ip", "unshare", "nsenter", "ssh", "ssh-keygen"]:
        if not shutil.which(tool, path=path):
            return f"`{tool}` is not installed"
    if not os.access("/usr/sbin/sshd", os.X_OK):
        return "/usr/sbin/sshd is not installed (openssh-server)"
    return None


def random_name(prefix: str = "mht") -> str:
    return prefix + secrets.token_hex(2)


class LabHandle:
    """A running lab, as tests use it. Every ``run``-like method returns a
    subprocess.CompletedProcess with text stdout/stderr captured, and never raises on a
    non-zero exit unless given ``check=True``."""

    def __init__(self, lab: Lab, n: int):
        self.lab = lab
        self.n = n
        self.env = dict(os.environ)
        # `python -m multihost` must import this checkout, installed or not.
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)

    # -- where things are --------------------------------------------------------------
    name = property(lambda self: self.lab.name)
    dir = property(lambda self: self.lab.dir)
    hostfile = property(lambda self: self.lab.hostfile)   # <dir>/hosts.ini
    home = property(lambda self: self.lab.home)           # the controller's HOME

    def address(self, i: int) -> str:
        return self.lab.address(i)

    def env_with(self, **names: str) -> Dict[str, str]:
        """The controller's environment with ``names`` set, for one command: a test of a
        host lost or a hung python sets the waits short (multihost/waits.py), as a user on
        a fast network would."""
        return {**self.env, **names}

    @property
    def addresses(self) -> List[str]:
        return [self.address(i) for i in range(1, self.n + 1)]

    # -- running things ----------------------------------------------------------------
    def _run(self, argv: Sequence[str], timeout: float, check: bool, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("env", self.env)
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)  # never wait on the terminal
        return subprocess.run(list(argv), timeout=timeout, check=check, **kw)

    def run(self, argv: Sequence[str], *, timeout: float = 120, check: bool = False,
            **kw) -> subprocess.CompletedProcess:
        """Run argv as the controller: in the lab's controller namespace, HOME and ~/.ssh
        the lab's, MULTIHOST_LAB_DIR set (see Lab.exec_argv)."""
        return self._run(self.lab.exec_argv(argv), timeout, check, **kw)

    def popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start argv as the controller without waiting (a long job, a session to keep)."""
        kw.setdefault("env", self.env)
        return subprocess.Popen(self.lab.exec_argv(argv), **kw)

    def multihost(self, *args: str, timeout: float = 300, check: bool = False,
                  **kw) -> subprocess.CompletedProcess:
        """`multihost ARGS...` of this checkout, run as the controller."""
        return self.run([sys.executable, "-m", "multihost", *args], timeout=timeout,
                        check=check, **kw)

    def ssh(self, i: int, command: str, *, connect_timeout: int = 5, timeout: float = 60,
            check: bool = False, **kw) -> subprocess.CompletedProcess:
        """`ssh 198.18.0.(10+i) COMMAND` with the system OpenSSH client, as the controller."""
        return self.run(["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(connect_timeout)}",
                         self.address(i), command], timeout=timeout, check=check, **kw)

    def host_run(self, i: int, argv: Sequence[str], *, timeout: float = 60, check: bool = False,
                 **kw) -> subprocess.CompletedProcess:
        """Run argv inside host i directly (no ssh): its network, mounts, PIDs, hostname."""
        return self._run(self.lab.host_argv(i, argv), timeout, check, **kw)

    # -- faults, always undone -------------------------------------------------------------
    @contextlib.contextmanager
    def cut_link(self, i: int) -> Iterator[None]:
        """Host i's cable unplugged for the duration of the block."""
        self.lab.cut(i)
        try:
            yield
        finally:
            self.lab.heal(i)

    @contextlib.contextmanager
    def sshd_stopped(self, i: int) -> Iterator[None]:
        """Host i's sshd stopped (the host and its processes live on) for the block."""
        self.lab.sshd_stop(i)
        try:
            yield
        finally:
            self.lab.sshd_start(i)

    def controller_script(self, script: str, args: Sequence[str], stopped: Optional[int] = None) -> str:
        """Run ``script`` as the controller, in a process of its own: it connects to every
        host, prints "connected" and waits for a line; host ``stopped``'s sshd is stopped
        in between (so only host-to-host ssh loses it). Its stdout, once it exit 0."""
        proc = self.popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "connected", proc.stderr.read()
            with self.sshd_stopped(stopped) if stopped is not None else contextlib.nullcontext():
                proc.stdin.write("go\n")
                proc.stdin.flush()
                out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        return out

    def control_sockets(self) -> List[Path]:
        """The control sockets of the OpenSSH masters commands left (live or stale)."""
        directory = self.home / ".cache" / "multihost" / "ssh"
        return sorted(directory.iterdir()) if directory.is_dir() else []

    def masters(self) -> Dict[str, List[int]]:
        """The live OpenSSH masters that commands left on the controller: {the address
        of the host they are connected to: their pids}. Commands reaching a host with
        other options (user, port, identity) leave masters of their own. Stale sockets
        (a master killed) are passed over."""
        found: Dict[str, List[int]] = {}
        for path in self.control_sockets():
            shown = self.run(["ssh", "-o", f"ControlPath={path}", "-O", "check", "x"], timeout=10)
            pid = re.search(r"pid=(\d+)", shown.stderr + shown.stdout)
            peer = _tcp_peer(int(pid.group(1))) if pid else None
            if peer:
                found.setdefault(peer, []).append(int(pid.group(1)))
        return found

    def stop_masters(self) -> None:
        """Every master that earlier commands left ends (``ssh -O exit``): what a test
        then finds was left by its own commands."""
        for path in self.control_sockets():
            self.run(["ssh", "-o", f"ControlPath={path}", "-O", "exit", "x"], timeout=10)
        deadline = time.monotonic() + 10
        while self.masters():
            assert time.monotonic() < deadline, "masters left by earlier tests did not end"
            time.sleep(0.2)

    def wait_for_masters(self, hosts: Sequence[int], timeout: float = 30) -> List[int]:
        """The pids of every live master to ``hosts``, once there is one to each of them
        (a sync starts them once its files are delivered)."""
        addresses = [self.address(i) for i in hosts]
        deadline = time.monotonic() + timeout
        while True:
            live = self.masters()
            if all(a in live for a in addresses):
                return [pid for a in addresses for pid in live[a]]
            assert time.monotonic() < deadline, f"no master for {set(addresses) - set(live)}"
            time.sleep(0.2)

    @staticmethod
    def tree_digest(root: Path) -> dict:
        """{relative path: sha256} of every file under ``root`` (on this machine)."""
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    def host_path(self, i: int, path: str) -> Path:
        """Where host ``i``'s ``path`` (under its home, /root) is on this machine."""
        return self.lab.paths.host_root(i) / Path(path).relative_to("/root")

    def assert_no_relay_left(self, hosts: Sequence[int]) -> None:
        """No relay node, join or push running on any of ``hosts``, no rendezvous socket
        (a join may still be exiting as its session closes: a few seconds' grace)."""
        ops = ("sync.join", "sync.receive", "sync.push")
        left: dict = {}
        for _ in range(50):
            left = {}
            for i in hosts:
                ps = self.host_run(i, ["ps", "-eo", "args"], check=True).stdout
                busy = [line for line in ps.splitlines() if any(op in line for op in ops)]
                relay_dir = self.lab.paths.host_root(i) / ".cache" / "multihost" / "relay"
                sockets = list(relay_dir.iterdir()) if relay_dir.is_dir() else []
                if busy or sockets:
                    left[i] = (busy, sockets)
            if not left:
                return
            time.sleep(0.2)
        raise AssertionError(f"left behind: {left}")


@pytest.hookimpl(tryfirst=True)   # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if HERE in path.parents:
            item.add_marker(pytest.mark.lab)
            # With workers (scripts/test.sh: -n 2 --dist loadgroup) a file's tests stay on
            # one worker, so each file's lab is built once. The 64-host lab loads the
            # machine like nothing else: it shares the unit tests' worker, whose runs on
            # this machine time real processes, so the two never overlap.
            item.add_marker(pytest.mark.xdist_group("unit" if path.stem == "test_scale"
                                                    else path.stem))


def cached_venv(venv: Path, packages: Sequence[str], probe: str) -> str:
    """The python of a venv that ``probe`` (python code) passes in, made once with
    ``packages`` where it is missing; one maker at a time, whatever the test workers."""
    import fcntl

    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not python.exists() or subprocess.run([str(python), "-c", probe],
                                                 capture_output=True).returncode != 0:
            base = Path(sys.base_prefix) / "bin" / "python3"
            subprocess.run([str(base), "-m", "venv", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True,
                           timeout=1800)
    return str(python)


def _tcp_peer(pid: int) -> Optional[str]:
    """The IPv4 address process ``pid``'s first TCP connection goes to (a master's title
    is its socket's path: its command line no longer names the host)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        table = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None   # it died just now
    for row in table:
        fields = row.split()
        if f"socket:[{fields[9]}]" in inodes:
            peer = bytes.fromhex(fields[2].split(":")[0])[::-1]
            return ".".join(str(b) for b in peer)
    return None


@contextlib.contextmanager
def running_lab(n: int, containers: bool = False) -> Iterator[LabHandle]:
    """A lab of n hosts with a random name, down again on exit; ``containers``: podman
    in every host (multihost/lab/containers.py)."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(f"no lab on this machine: {reason}")
    the_lab = Lab(random_name())
    # Belt and braces: pytest runs this fixture's teardown on failures and Ctrl-C; atexit
    # catches an exit that skips it. down() is idempotent, so both may run.
    atexit.register(the_lab.down)
    the_lab.up(n, with_containers=containers)  # tears down what it built if it fails
    try:
        yield LabHandle(the_lab, n)
    finally:
        the_lab.down()
        atexit.unregister(the_lab.down)


@pytest.fixture
def relay_code(tmp_path) -> Path:
    """A code directory heavy enough to go host to host (a 17 MB file), 20 small files."""
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    for i in range(20):
        (root / "pkg" / f"m{i}.py").write_text(f"VALUE = {i}\n")
    (root / "weights.bin").write_bytes(os.urandom(17 << 20))
    return root


@pytest.fixture(scope="session")
def lab() -> Iterator[LabHandle]:
    with running_lab(HOSTS) as handle:
        yield handle


@pytest.fixture(scope="module")
def lab6() -> Iterator[LabHandle]:
    """Six hosts: more than the session lab, for what grows with the number of hosts."""
    with running_lab(6) as handle:
        yield handle


@pytest.fixture(scope="module")
def lab9() -> Iterator[LabHandle]:
    """9 hosts for one test module: one more than a sync relay used to keep as a chain."""
    with running_lab(9) as handle:
        yield handle


@pytest.fixture(scope="module")
def lab64() -> Iterator[LabHandle]:
    """A 64-host lab (the top of our users' range) for one test module, down after it."""
    with running_lab(64) as handle:
        yield handle
