"""PID 1 of one lab host. Stdlib only; run as ``python init.py BOOT_JSON`` by
``ip netns exec NS unshare --mount --uts --ipc --pid --fork --mount-proc --propagation slave``.

It makes this mount namespace look like a machine of its own, starts sshd as a child and
then stays, reaping orphans. sshd is not PID 1, so killing sshd alone leaves the host and
its jobs running ("sshd killed mid-run"); SIGKILL to this process from outside ends every
process of the host at once, which is how `lab down` leaves nothing behind.

Signals (sent from outside to this process's real pid):
  SIGUSR1  start sshd if it is not running       SIGUSR2  stop sshd (TERM, then KILL after 3 s)
  SIGTERM  end the host
sshd's state is written to <log>/sshd.state for the controller to read.

The controller of a Slurm lab boots from the same file with no sshd and no private /root
or /tmp (``"sshd": null``, ``"root": null``): it only needs its own hostname and /run for
slurmctld and munged. ``binds`` ([source, target] pairs) are extra files bound in place,
such as the lab's /etc/slurm and /etc/munge.
"""
import ctypes
import json
import os
import signal
import socket
import sys
import time

MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 0x2, 0x4, 0x1000, 0x4000
WATCHED = {signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT,
           signal.SIGHUP}
# Python ignores some signals and the lab's launcher shell ignores others; sshd and the
# sessions it starts must see every signal at its default, as on a real machine.
DEFAULT_SIGNALS = WATCHED | {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGQUIT}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOSTNAME = "?"  # for log lines, set once the config is read

_libc = ctypes.CDLL(None, use_errno=True)


def log(msg):
    print(f"{time.strftime('%H:%M:%S')} init[{HOSTNAME}]: {msg}", flush=True)


def mount(source, target, fstype=None, flags=0, data=None):
    rc = _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                     ctypes.c_ulong(flags), data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def ensure_mountpoint(path, is_dir):
    """Make ``path`` exist (following a dangling symlink to where it points) so a bind
    mount can land on it; it is created in the host's private /root, /tmp or /run."""
    real = os.path.realpath(path)
    if os.path.exists(real):
        return
    os.makedirs(real if is_dir else os.path.dirname(real), exist_ok=True)
    if not is_dir:
        open(real, "a").close()


class Pins:
    """O_PATH handles on every bind source, taken before anything is hidden: a source
    under /tmp or /root stays reachable as /proc/self/fd/N after those are replaced."""

    def __init__(self):
        self.fds = {}

    def pin(self, path):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        self.fds[path] = (fd, os.path.isdir(path))
        return path

    def bind(self, source, target, rec=False):
        fd, is_dir = self.fds[source]
        ensure_mountpoint(target, is_dir)
        mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | (MS_REC if rec else 0))

    def close(self):
        for fd, _ in self.fds.values():
            os.close(fd)
        self.fds.clear()


def build_machine(cfg):
    boot = cfg["boot"]
    # Read what sshd needs now: it will live in the private /run, where sshd's
    # per-connection re-exec finds it again (pitfall 3).
    files = []
    if cfg.get("sshd"):
        for name in ["sshd_config", "ssh_host_ed25519_key"]:
            with open(os.path.join(boot, name), "rb") as f:
                files.append((name, f.read()))
    pins = Pins()
    for path in [cfg.get("root"), cfg.get("tmp"), cfg["log"], cfg["etc_hosts"], cfg["resolv_conf"]]:
        if path:
            pins.pin(path)
    binds = [(pins.pin(source), target) for source, target in cfg.get("binds", [])]
    shares = [pins.pin(p) for p in cfg["shares"] if os.path.exists(p)]

    # A private /run with /run/sshd (pitfall 1), and private /var/log and /dev/shm: sshd's
    # lastlog/wtmp and a job's shared memory stay inside the host.
    mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for d, mode in [("/run/sshd", 0o755), ("/run/lock", 0o1777), (cfg["run_dir"], 0o700),
                    (cfg["log_dir"], 0o755)]:
        os.makedirs(d, exist_ok=True)
        os.chmod(d, mode)
    for name, data in files:
        fd = os.open(os.path.join(cfg["run_dir"], name), os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, data)
        os.close(fd)
    if os.path.isdir("/var/log"):
        mount("tmpfs", "/var/log", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    pins.bind(cfg["log"], cfg["log_dir"])
    if cfg.get("root"):
        pins.bind(cfg["root"], "/root")
    if cfg.get("tmp"):
        pins.bind(cfg["tmp"], "/tmp")
    mount_cgroups(cfg.get("cgroups") or ())
    pins.bind(cfg["etc_hosts"], "/etc/hosts")
    pins.bind(cfg["resolv_conf"], "/etc/resolv.conf")
    for source, target in binds:
        pins.bind(source, target)
    # Shared paths come back at the same place, like an NFS mount (parents first).
    for path in shares:
        pins.bind(path, path, rec=True)
    pins.close()
    socket.sethostname(cfg["hostname"])
    os.chdir("/root" if cfg.get("root") else "/")


def mount_cgroups(hierarchies):
    """The machine's cgroup hierarchies again, under this host's fresh /sys (``ip netns
    exec`` mounted one with none): a container engine in the host needs them."""
    if not hierarchies:
        return
    mount("tmpfs", "/sys/fs/cgroup", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for fstype, options, target in hierarchies:
        os.makedirs(target, exist_ok=True)
        mount("cgroup", target, fstype, MS_NOSUID | MS_NODEV, options or None)


class Sshd:
    def __init__(self, cfg):
        self.argv = [cfg["sshd"], "-D", "-f", os.path.join(cfg["run_dir"], "sshd_config"),
                     "-E", os.path.join(cfg["log_dir"], "sshd.log")]
        self.state_file = os.path.join(cfg["log_dir"], "sshd.state")
        self.pid = None
        self.kill_at = None

    def write_state(self, **state):
        tmp = self.state_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, self.state_file)

    def start(self):
        if self.pid is not None or not self.argv[0]:
            return
        env = {"PATH": PATH, "LANG": os.environ.get("LANG", "C.UTF-8")}
        self.pid = os.posix_spawn(self.argv[0], self.argv, env, setsigmask=(),
                                  setsigdef=DEFAULT_SIGNALS)
        self.kill_at = None
        self.write_state(running=True, pid=self.pid, since=time.time())
        log(f"sshd started (pid {self.pid} in the host)")

    def stop(self):
        if self.pid is not None:
            os.kill(self.pid, signal.SIGTERM)
            self.kill_at = time.monotonic() + 3.0

    def exited(self, status):
        code = os.waitstatus_to_exitcode(status)
        log(f"sshd exited ({code})")
        self.pid = None
        self.kill_at = None
        self.write_state(running=False, exit=code, since=time.time())

    def overdue(self):
        if self.pid is not None and self.kill_at and time.monotonic() > self.kill_at:
            os.kill(self.pid, signal.SIGKILL)
            self.kill_at = None


def serve(sshd):
    """Be PID 1: reap every child, obey the control signals, never exit on its own."""
    while True:
        info = signal.sigtimedwait(WATCHED, 1.0)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == sshd.pid:
                sshd.exited(status)
        sshd.overdue()
        if info is None:
            continue
        if info.si_signo == signal.SIGUSR1:
            sshd.start()
        elif info.si_signo == signal.SIGUSR2:
            sshd.stop()
        elif info.si_signo in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            log("ending the host")
            return 0  # PID 1 exiting makes the kernel kill the whole namespace


def main(argv):
    global HOSTNAME
    # Block before anything else, so no control signal is lost or kills us by default.
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    with open(argv[1]) as f:
        cfg = json.load(f)
    HOSTNAME = cfg["hostname"]
    try:
        build_machine(cfg)
        # What waits for a machine without sshd (the Slurm lab's ctl) waits for this.
        open(os.path.join(cfg["log_dir"], "booted"), "w").close()
        sshd = Sshd(cfg)
        sshd.start()
    except OSError as exc:
        log(f"boot failed: {exc}")
        return 1
    return serve(sshd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
