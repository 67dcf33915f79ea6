"""The SSH transport, on paramiko: commands and processes on a logged-in connection.
Connecting and logging in (ssh_config, ProxyJump, host keys, the one-line errors) is
ssh_login.py; with hostkeys.py, these are the only modules that import paramiko.

Why paramiko directly and not fabric's ``Connection``: fabric accepts every host key
without checking known_hosts (it installs ``AutoAddPolicy`` unconditionally), and its
``run()`` costs 14-22 ms per command in invoke's polling threads, against 1-3 ms for a
raw channel. ``~/.ssh/config`` is honoured through paramiko's own ``SSHConfig``
(Host aliases, HostName, User, Port, IdentityFile, ProxyJump, ConnectTimeout,
UserKnownHostsFile, StrictHostKeyChecking), the same keys fabric reads. The fabric
connections handed to users (fabric_bridge.py) log in through ssh_login.py's
``checking_client`` and ``login``, so they check host keys exactly as this transport does.

Every failure becomes a ConnectError that names the host, the cause and the fix.
"""
from __future__ import annotations

import select
import threading
import time
from typing import List, Optional

from ..errors import CommandTimeout, ConnectError
from ..hosts import Host
from ._paramiko import paramiko
from .base import (Command, CommandResult, InputStream, Process, SshOptions, Transport,
                   judge_start, kill_group_line, remote_line, split_start, to_shell)
from .ssh_login import (SshTarget, checking_client, jump_host, load_ssh_config, login,
                        open_jump_channel, open_socket, resolve_target)


class ChannelInput(InputStream):
    """A channel's stdin. Besides socket errors, paramiko raises its own SSHException and
    EOFError for a channel or connection that is gone: all of them are a BrokenStream."""

    errors = (OSError, ValueError, EOFError, paramiko.SSHException)

    def __init__(self, channel: paramiko.Channel):
        super().__init__(channel.makefile_stdin("wb"))
        self._channel = channel

    def _end(self) -> None:
        """EOF by shutting the channel's write side; the file itself is not closed:
        paramiko closes it again when it is collected, and a second close raises (in
        __del__, where it can only be printed)."""
        self._raw.flush()
        send_eof(self._channel)


EOF_WAIT = 30.0   # paramiko's own bound on a key exchange that holds up a message


def send_eof(channel: paramiko.Channel) -> None:
    """The channel's EOF, never after its CLOSE. paramiko's ``shutdown_write`` picks the
    EOF under the channel's lock but sends it after releasing it: a command that ends
    meanwhile has its CLOSE answered first, sshd frees the channel, then reads an EOF
    for a channel it no longer has and drops the whole connection ("ieof packet referred
    to nonexistent channel"): every other command of the host's was lost with it. On a
    busy controller that gap is wide, and a stream's end is when its command ends.
    Here the EOF goes out holding the transport's send lock, taken under the channel's:
    a CLOSE answered meanwhile waits for it, and a channel closed already gets none."""
    transport = channel.get_transport()
    if not all(hasattr(transport, name) for name in ("clear_to_send", "clear_to_send_lock",
                                                       "_send_message")) \
            or not hasattr(channel, "_send_eof"):
        channel.shutdown_write()   # a paramiko without these internals: its own way
        return
    deadline = time.monotonic() + EOF_WAIT
    while True:
        transport.clear_to_send.wait(0.1)   # not while keys are exchanged (as paramiko)
        if not transport.is_active():
            return
        with channel.lock:
            if channel.closed or channel.eof_sent:
                return
            # Never waited for under the channel's lock: its holder may be a send blocked
            # on a full socket, and paramiko's reader needs this lock to read on.
            if transport.clear_to_send_lock.acquire(blocking=False):
                if transport.clear_to_send.is_set():
                    message = channel._send_eof()
                    break
                transport.clear_to_send_lock.release()
        time.sleep(0.005)
        if time.monotonic() > deadline:
            raise paramiko.SSHException("Key-exchange timed out waiting for key negotiation")
    try:
        transport._send_message(message)
    finally:
        transport.clear_to_send_lock.release()


class SshProcess(Process):
    def __init__(self, channel: paramiko.Channel, label: str,
                 transport: Optional["SshTransport"] = None):
        self._channel = channel
        self._label = label
        self._transport = transport
        self.stdout = channel.makefile("rb")
        self.stdin = ChannelInput(channel)
        self._stderr = channel.makefile_stderr("rb")

    def read_stderr(self) -> bytes:
        return split_start(self._stderr.read())[2]

    def kill(self) -> None:
        """Stop the command now: its process group on the host ends (closing the channel
        alone leaves a command that does not write, a hung python, running there)."""
        self.end_group()
        self.close()

    def end_group(self) -> None:
        channel = self._channel
        if channel is not None and self._transport is not None and not channel.exit_status_ready():
            data = b""
            while channel.recv_stderr_ready():
                data += channel.recv_stderr(65536)
            pid = split_start(data)[0]
            if pid is not None:
                self._transport.kill_group(pid)

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._channel.status_event.wait(timeout):
            raise CommandTimeout(f"command still running after {timeout:.0f}s", host=self._label)
        return self._channel.recv_exit_status()

    def close(self) -> None:
        if self._channel is None:
            return
        self._channel.close()
        self._channel = None  # type: ignore[assignment]
        # paramiko's files flush at garbage collection and complain once the channel is
        # closed: drop them with it
        self.stdin = self.stdout = self._stderr = None  # type: ignore[assignment]

    def set_timeout(self, seconds: Optional[float]) -> None:
        self.read_timeout = seconds
        self._channel.settimeout(seconds)


class SshTransport(Transport):
    def __init__(self, host: Host, client: paramiko.SSHClient, target: SshTarget,
                 jump: Optional["SshTransport"] = None):
        self.host = host
        self.target = target
        self._client = client
        self._jump = jump
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, host: Host, options: SshOptions = SshOptions(),
                config: Optional[paramiko.SSHConfig] = None, *,
                origin: Optional[str] = None, hops: int = 0) -> "SshTransport":
        """Connect to host; ``origin`` and ``hops`` are for its jump hosts (ProxyJump):
        the host the user named, and how many jump hosts stand before this one."""
        config = config or load_ssh_config(options.config_file)
        target = resolve_target(host, options, config)
        label = host.label
        jump = None
        if target.proxy_jump:
            jump = cls.connect(jump_host(target, origin or label, hops), options, config,
                               origin=origin or label, hops=hops + 1)
            try:
                sock = open_jump_channel(jump._client.get_transport(), target, label)
            except ConnectError:
                jump.close()
                raise
        else:
            sock = open_socket(target, label)
        client = checking_client(target)
        try:
            login(client, target, sock, label)
        except BaseException:
            if jump:
                jump.close()
            raise
        client.get_transport().set_keepalive(options.keepalive)
        return cls(host, client, target, jump)

    def _channel(self) -> paramiko.Channel:
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise _lost(self.host.label, _why_ended(transport))
        try:
            return transport.open_session(timeout=self.target.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _lost(self.host.label, f" ({exc or type(exc).__name__})") from None

    def run(self, command: Command, *, input: Optional[bytes] = None,
            timeout: Optional[float] = None, cwd: Optional[str] = None) -> CommandResult:
        line = to_shell(command, cwd)
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        channel = self._channel()
        try:
            channel.exec_command(remote_line(line))
            if input:
                channel.sendall(input)
            send_eof(channel)
            stdout, stderr = _drain(channel, deadline)
            if stdout is None:
                pid = split_start(stderr)[0]
                if pid is not None:  # what it started there ends with it
                    self.kill_group(pid)
                raise CommandTimeout(f"command did not finish within {timeout:g}s: {line[:80]}",
                                     host=self.host.label)
            code = channel.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _lost(self.host.label, f" during a command ({exc})") from None
        finally:
            channel.close()
        return judge_start(CommandResult(self.host.label, line, code, stdout, stderr,
                                         time.monotonic() - started), self.host.label,
                           self.login_hint())

    def start(self, command: Command, *, cwd: Optional[str] = None) -> Process:
        channel = self._channel()
        try:
            channel.exec_command(remote_line(to_shell(command, cwd)))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            channel.close()   # the host closed the connection as the command was asked for
            raise _lost(self.host.label, f" ({exc or type(exc).__name__})") from None
        return SshProcess(channel, self.host.label, self)

    def kill_group(self, pid: int) -> None:
        """End the process group ``pid`` leads on the host (a command given up on), on a
        channel of its own. Best effort: a lost connection has ended the session anyway."""
        try:
            channel = self._channel()
            try:
                channel.exec_command(remote_line(kill_group_line(pid)))
                send_eof(channel)
                channel.status_event.wait(KILL_WAIT)
            finally:
                channel.close()
        except (ConnectError, paramiko.SSHException, OSError, EOFError):
            pass

    def login_hint(self) -> str:
        from .openssh import login_command
        import shlex

        return login_command(self.target.user, shlex.quote(self.target.hostname), self.target.port)

    def close(self) -> None:
        self._client.close()
        if self._jump:
            self._jump.close()


KILL_WAIT = 5.0


def _lost(label: str, why: str) -> ConnectError:
    """A connection that died, ``why`` as a clause after the words ("" when unknown)."""
    return ConnectError(f"the ssh connection was lost{why}", host=label,
                        kind=ConnectError.LOST, fix="check the host and the network")


def _why_ended(transport) -> str:
    """What ended a connection, as its reader saw it: ' (the host closed it)', or the
    socket's error (ETIMEDOUT: nothing acknowledged for ssh_login.DEAD_LINK seconds)."""
    exc = getattr(transport, "saved_exception", None)
    if exc is None:
        return ""
    if isinstance(exc, EOFError):
        return " (the host closed it)"
    return f" ({exc or type(exc).__name__})"


def _drain(channel: paramiko.Channel, deadline: Optional[float]):
    """Read stdout and stderr together until both end; (None, stderr so far) on timeout."""
    out: List[bytes] = []
    err: List[bytes] = []

    def take() -> None:
        while channel.recv_ready():
            out.append(channel.recv(65536))
        while channel.recv_stderr_ready():
            err.append(channel.recv_stderr(65536))

    while True:
        take()
        # Data, EOF, exit status and close may all land between take() and these tests:
        # each way out reads the buffers once more, so no line the command wrote is lost.
        if channel.exit_status_ready() and channel.eof_received:
            take()
            break
        transport = channel.get_transport()
        if channel.closed or transport is None or not transport.is_active():
            if channel.exit_status_ready():
                take()
                break  # closed right after its exit status: nothing more will come
            # the connection died (a dead link dropped after ssh_login.DEAD_LINK): no exit status
            # will ever come, so do not wait for one
            raise EOFError("the connection closed before the command's exit status came")
        wait = 1.0 if deadline is None else deadline - time.monotonic()
        if wait <= 0:
            return None, b"".join(err)
        select.select([channel], [], [], min(wait, 1.0))
    return b"".join(out), b"".join(err)
