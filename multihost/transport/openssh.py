"""Reused OpenSSH connections: one ControlMaster per host that outlives the command.

A sync that finds nothing to do costs one `stat` per host, and a full SSH handshake per
host would be most of its time. So, as Ansible and SkyPilot do, a command that connects
to a host also leaves an OpenSSH master connection behind it (ControlMaster=auto, ControlPersist: it ends by
itself after MULTIHOST_CONTROL_PERSIST idle seconds, 600 by default; 0 turns this off);
a sync starts them once its files are delivered.
The next command's quick checks go through that master (no handshake), spoken to over
its control socket as the `ssh` client speaks to it (mux_client.py).

Only quick, retryable steps use these connections (the sync's no-change and small-change
path). When there is no master, or it does not answer, the caller goes the paramiko way,
which reports every failure in full: this module never decides that a host is down.

Security: the control sockets live in ~/.cache/multihost/ssh (or, when HOME is too deep
for a socket's path, /tmp/multihost-ssh-UID), a directory that must be ours alone (0700,
not a link; OpenSSH makes the sockets 0600), named by a hash of everything that decides
where a connection goes (host, user, port, identity file, ssh config file). A master is
an ordinary `ssh` in batch mode with strict host-key checking: an unknown key is refused
unless --accept-new-host-keys, a changed key always is, as on the paramiko path.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import stat
import subprocess
from typing import List, Optional

from ..errors import ConfigError
from ..hosts import Host
from .base import (Command, CommandResult, Process, SshOptions, judge_start, kill_group_line,
                   remote_line, split_start, to_shell)
from .local import LocalProcess, LocalTransport
from .mux_client import MuxChannel

CONTROL_DIRS = ("~/.cache/multihost/ssh", "/tmp/multihost-ssh-{uid}")
PERSIST_ENV = "MULTIHOST_CONTROL_PERSIST"
DEFAULT_PERSIST = 600
DEFAULT_CONFIG = "~/.ssh/config"
# A unix socket path holds 107 bytes, and OpenSSH binds a temporary name 17 bytes longer
# before renaming it into place.
MAX_SOCKET_PATH = 88


def persist_seconds() -> int:
    """How long an idle master lives on (0: no masters, no reuse)."""
    text = os.environ.get(PERSIST_ENV, "").strip()
    if not text:
        return DEFAULT_PERSIST
    if not text.isdigit():
        raise ConfigError(f"{PERSIST_ENV}={text!r} is not a number of seconds",
                          fix=f"set {PERSIST_ENV} to idle seconds, like 600, or 0 to turn "
                              "connection reuse off")
    return int(text)


def known_hosts_name(hostname: str, port: int) -> str:
    """The name a key is filed under in known_hosts, as both ssh and paramiko file it:
    the address alone on port 22, ``[address]:port`` on any other."""
    return hostname if not port or int(port) == 22 else f"[{hostname}]:{port}"


def forget_key_command(hostname: str, port: int) -> str:
    """The `ssh-keygen -R` line that drops a host's recorded key (port included)."""
    return "ssh-keygen -R " + shlex.quote(known_hosts_name(hostname, port))


def openssh_policy(accept_new: bool, key_name: Optional[str]) -> List[str]:
    """The options that give an OpenSSH client exactly the paramiko path's policy,
    whatever the user's ssh config says (command-line options win over it): an unknown
    key refused unless accept-new, a changed one always; and, given ``key_name``, the key
    looked up under the name the paramiko path checked, not one the config aliases."""
    argv = ["-o", "StrictHostKeyChecking=" + ("accept-new" if accept_new else "yes")]
    if key_name:
        argv += ["-o", f"HostKeyAlias={key_name}"]
    return argv


def ssh_base(connect_timeout: float, *, accept_new: bool, key_name: Optional[str]) -> List[str]:
    """What every `ssh` multihost starts has (the controller's, and the hosts' own for
    relays): no tty, no forwarding, never a prompt, a dead link noticed in 15 s, and the
    host-key policy of the paramiko path (each caller has to say which: a `Host *` block
    with StrictHostKeyChecking=no in the user's config must not loosen it)."""
    return ["ssh", "-T", "-x", "-a", "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, int(connect_timeout))}",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            "-o", "LogLevel=ERROR"] + openssh_policy(accept_new, key_name)


def login_command(user: Optional[str], hostname: str, port: Optional[int]) -> str:
    """The plain `ssh` line a fix tells the user to try (port included when not 22)."""
    where = f"{user}@{hostname}" if user else hostname
    return f"ssh -p {port} {where}" if port and int(port) != 22 else f"ssh {where}"


def client_argv(host: Host, options: SshOptions) -> List[str]:
    """`ssh` reaching the host as a user's own `ssh` would (OpenSSH reads ~/.ssh/config
    itself, and files the key under its HostName as paramiko does), never interactive,
    never accepting a changed host key."""
    argv = ssh_base(options.connect_timeout, accept_new=options.accept_new_host_keys,
                    key_name=None)
    config = os.path.expanduser(options.config_file or DEFAULT_CONFIG)
    if config != os.path.expanduser(DEFAULT_CONFIG):
        argv += ["-F", config]
    if host.user:
        argv += ["-l", host.user]
    if host.port:
        argv += ["-p", str(host.port)]
    if host.identity_file:
        argv += ["-i", os.path.expanduser(host.identity_file), "-o", "IdentitiesOnly=yes"]
    return argv


def control_path(host: Host, options: SshOptions) -> Optional[str]:
    """Where this host's master listens; None when reuse is off or no directory gives a
    path short enough."""
    if persist_seconds() == 0:
        return None
    identity = "\0".join((host.name, host.user or "", str(host.port or ""),
                          host.identity_file or "", os.path.expanduser(options.config_file or ""),
                          "accept-new" if options.accept_new_host_keys else ""))
    name = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    for template in CONTROL_DIRS:
        path = os.path.join(os.path.expanduser(template.format(uid=os.getuid())), name)
        if len(path.encode()) <= MAX_SOCKET_PATH:
            return path
    return None


def private_dir(directory: str) -> bool:
    """The directory exists (made 0700 if it did not) and is ours alone: a real
    directory, our own, closed to everyone else. Anything else: no reuse."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


class MuxTransport(LocalTransport):
    """Commands through a live master, spoken to over its control socket (mux_client.py:
    no `ssh` client process per command). A master that is gone makes a command end at
    once with status 255, as the `ssh` client would with ProxyCommand=false, instead of
    starting a handshake of its own: the caller goes the paramiko way."""

    is_local = False

    def __init__(self, host: Host, path: str):
        super().__init__(host)
        self._path = path

    @classmethod
    def open(cls, host: Host, options: SshOptions) -> Optional["MuxTransport"]:
        """A transport through the host's master, or None when there is none (or its
        socket's directory is not ours alone)."""
        path = control_path(host, options)
        if path is None or not os.path.exists(path) or not private_dir(os.path.dirname(path)):
            return None
        return cls(host, path)

    def _spawn(self, line: str, with_stdin: bool) -> MuxChannel:
        return MuxChannel(self._path, remote_line(line), with_stdin)

    def start(self, command: Command, *, cwd: Optional[str] = None) -> Process:
        channel = self._spawn(to_shell(command, cwd), with_stdin=True)
        return MuxProcess(channel, self.host.label, lambda: self._end_on_host(channel))

    def _give_up(self, popen: MuxChannel) -> bytes:
        """The session is left; on the host, the command's process group is ended too
        (through the master): a hung python there is not left behind."""
        popen.kill()
        self._end_on_host(popen)
        try:
            return popen.communicate(timeout=5)[1]
        except subprocess.TimeoutExpired:   # a child that left the group holds the pipes
            return popen.output_so_far()[1]

    def _end_on_host(self, channel: MuxChannel) -> None:
        """The process group of the command on ``channel`` ended where it runs (its
        shell's pid came first on its stderr), with a line of its own through the master."""
        pid = split_start(channel.output_so_far()[1])[0]
        if pid is None:
            return
        ender = self._spawn(kill_group_line(pid), with_stdin=False)
        try:
            ender.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            pass   # best effort: the master may be gone with the host
        finally:
            ender.close()

    def _result(self, result: CommandResult) -> CommandResult:
        return judge_start(result, self.host.label,
                           login_command(self.host.user, shlex.quote(self.host.name),
                                         self.host.port))


class MuxProcess(LocalProcess):
    """A started command through a master: no local process stands for it, so ending
    its group is done on the host, through the master."""

    def __init__(self, channel: MuxChannel, label: str, end_on_host):
        super().__init__(channel, label)
        self._end_on_host = end_on_host

    def end_group(self) -> None:
        self._end_on_host()

    def close(self) -> None:
        super().close()
        self._popen.kill()   # an `ssh` client left with its pipes closed would end too


def start_master(host: Host, options: SshOptions) -> Optional["subprocess.Popen[bytes]"]:
    """Leave a master connection to the host behind, in the background (never waited for:
    the command that asks goes on at once).

    The master's first session runs `true`; with ControlPersist the connection then stays,
    detached, and ends after the idle time. ControlMaster=auto: when a master is already
    there (two commands raced) this merely uses it, so none is left over; when only its
    socket is (the master was killed), OpenSSH removes it and becomes the new master."""
    path = control_path(host, options)
    if path is None or not private_dir(os.path.dirname(path)) or shutil.which("ssh") is None:
        return None
    argv = client_argv(host, options) + [
        "-o", "ControlMaster=auto", "-o", f"ControlPath={path}",
        "-o", f"ControlPersist={persist_seconds()}", "--", host.name, "true"]
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None
