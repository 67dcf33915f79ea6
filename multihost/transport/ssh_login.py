"""Connecting and logging in to an SSH host on paramiko: where to connect (the host's
fields over ~/.ssh/config, ProxyJump hops), the socket, the host-key check as OpenSSH
makes it, the key login, and every failure on the way as one ConnectError that names
the host, the cause and the fix.

Apart from ssh.py, which runs commands on a connection once it is made: this is
everything that happens before the first channel opens, and it is shared as it is by the
fabric connections handed to users (fabric_bridge.py uses ``resolve_target``,
``checking_client``, ``open_socket`` and ``login``), so both check host keys alike.
Never interactive: no password or passphrase prompt, no host-key prompt.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ConfigError, ConnectError
from ..host_parsing import parse_host_item
from ..hosts import Host
from ._paramiko import paramiko
from .base import SshOptions
from .hostcerts import CERT_SUFFIX
from .hostkeys import (HostKeyPolicy, RevokedHostKey, UnknownHostKey, is_revoked,
                       known_hosts_files, load_known_hosts)
from .openssh import forget_key_command, known_hosts_name, login_command

# paramiko's transport thread logs what it then raises to us (a banner that never came, a
# reset): with no handler, Python's last-resort handler would print that as a traceback
# under our one-line error. Every such failure reaches the user as a ConnectError.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# A ProxyJump chain longer than this is a loop in ssh_config (a jump host whose own
# ProxyJump leads back), which would otherwise recurse until Python gives up.
MAX_JUMPS = 8


@dataclass(frozen=True)
class SshTarget:
    """Where and as whom to connect, after ~/.ssh/config has been applied."""

    hostname: str
    port: int
    user: str
    identity_files: tuple
    proxy_jump: Optional[str]
    connect_timeout: float
    known_hosts: tuple
    accept_new: bool
    use_agent: bool


def load_ssh_config(path: str) -> paramiko.SSHConfig:
    config_path = Path(path).expanduser()
    if config_path.is_file():
        return paramiko.SSHConfig.from_path(str(config_path))
    return paramiko.SSHConfig()


def resolve_target(host: Host, options: SshOptions,
                   config: Optional[paramiko.SSHConfig] = None) -> SshTarget:
    """Merge the host's own fields (they win, like ssh's command line) over ssh_config."""
    entry = (config or load_ssh_config(options.config_file)).lookup(host.name)
    identity = [host.identity_file] if host.identity_file else list(entry.get("identityfile", []))
    strict = str(entry.get("stricthostkeychecking", "yes")).lower()
    proxy = entry.get("proxyjump")
    return SshTarget(
        hostname=entry.get("hostname", host.name),
        port=host.port or int(entry.get("port", 22)),
        user=host.user or entry.get("user") or os.environ.get("USER") or "root",
        identity_files=tuple(os.path.expanduser(p) for p in identity),
        proxy_jump=None if proxy in (None, "none") else proxy,
        connect_timeout=float(entry.get("connecttimeout", options.connect_timeout)),
        known_hosts=tuple(known_hosts_files(entry.get("userknownhostsfile"),
                                            entry.get("globalknownhostsfile"))),
        accept_new=options.accept_new_host_keys or strict in ("accept-new", "no", "off"),
        use_agent=str(entry.get("identitiesonly", "no")).lower() != "yes",
    )


def _socket_error(exc: OSError, label: str, target: SshTarget) -> ConnectError:
    where = f"{target.hostname}:{target.port}"
    if isinstance(exc, socket.gaierror):
        return ConnectError(f"name {target.hostname!r} does not resolve", host=label,
                            kind=ConnectError.NAME,
                            fix="check the spelling, /etc/hosts or DNS, or use the IP address")
    if isinstance(exc, ConnectionRefusedError):
        return ConnectError(f"connection refused on {where}", host=label, kind=ConnectError.REFUSED,
                            fix="start sshd on the host, or give the right port (--port)")
    if isinstance(exc, socket.timeout):
        return ConnectError(f"no answer from {where} within {target.connect_timeout:g}s",
                            host=label, kind=ConnectError.TIMEOUT,
                            fix="check that the host is up and that no firewall drops port "
                                f"{target.port}; ping it")
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return ConnectError(f"{where} is unreachable ({os.strerror(exc.errno)})", host=label,
                            kind=ConnectError.UNREACHABLE,
                            fix="check the address and the route to it")
    return ConnectError(f"cannot connect to {where}: {exc.strerror or exc}", host=label,
                        kind=ConnectError.UNREACHABLE, fix="check the address and the network")


DEAD_LINK = 20.0   # seconds of unacknowledged data before a connection counts as dead


def open_socket(target: SshTarget, label: str) -> socket.socket:
    try:
        sock = socket.create_connection((target.hostname, target.port), target.connect_timeout)
    except OSError as exc:
        raise _socket_error(exc, label, target) from None
    # Without TCP_NODELAY every round trip loses ~40 ms to Nagle plus delayed ACKs.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Every read from a host ends: on a dead link the keepalives (set_keepalive) go
    # unacknowledged, and after DEAD_LINK seconds the kernel drops the connection, which
    # ends any read blocked on it (instead of TCP's own ~15 minutes of retries). A live
    # host acknowledges at the TCP level however slow its programs are.
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(DEAD_LINK * 1000))
    return sock


class CertificateFirst(paramiko.Transport):
    """A client transport that offers the host-certificate algorithms before the plain
    ones, so that a host with a certificate sends it."""

    @property
    def preferred_keys(self):
        keys = super().preferred_keys
        return tuple(k for k in keys if k.endswith(CERT_SUFFIX)) + \
            tuple(k for k in keys if not k.endswith(CERT_SUFFIX))


def open_jump_channel(jump: paramiko.Transport, target: SshTarget, label: str) -> paramiko.Channel:
    """A tunnel from a connected jump host (ProxyJump) to the target's sshd."""
    try:
        return jump.open_channel("direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0),
                                 timeout=target.connect_timeout)
    except (paramiko.SSHException, OSError) as exc:
        raise ConnectError(f"jump host {target.proxy_jump} could not reach "
                           f"{target.hostname}:{target.port}: {exc}", host=label,
                           kind=ConnectError.UNREACHABLE,
                           fix="check the ProxyJump host's route to the target") from None


class CheckingClient(paramiko.SSHClient):
    """A client that checks the host key as OpenSSH would: the target's known_hosts files
    (read only: paramiko never rewrites them, marker lines understood) and multihost's
    policy. Every connection multihost makes with paramiko, its own or a fabric bridge's,
    gets its client here."""

    def __init__(self, target: SshTarget):
        super().__init__()
        self.known = load_known_hosts(target.known_hosts)
        self.key_name = known_hosts_name(target.hostname, target.port)
        self.known.fill(self.get_host_keys(), self.key_name)  # read-only: never written back
        self.set_missing_host_key_policy(
            HostKeyPolicy(target.accept_new, target.known_hosts[0], self.known, target.hostname))

    @property
    def certified(self) -> bool:
        """Known only through a CA: ask for its certificate first, as OpenSSH asks;
        paramiko would take the plain key, which nothing vouches for."""
        return bool(self.known.authorities_for(self.key_name)) and \
            self.get_host_keys().lookup(self.key_name) is None


def checking_client(target: SshTarget) -> CheckingClient:
    return CheckingClient(target)


def login(client: CheckingClient, target: SshTarget, sock, label: str) -> None:
    """Handshake, host-key check and key login over sock, never interactive. On failure
    the socket is closed and the cause becomes one ConnectError naming the host."""
    try:
        client.connect(
            target.hostname, target.port, username=target.user,
            key_filename=[p for p in target.identity_files if os.path.exists(p)] or None,
            look_for_keys=not target.identity_files, allow_agent=target.use_agent,
            sock=sock, timeout=target.connect_timeout, banner_timeout=target.connect_timeout,
            auth_timeout=target.connect_timeout, passphrase=None,
            transport_factory=CertificateFirst if client.certified else None)
    except BaseException as exc:
        client.close()
        sock.close()
        if isinstance(exc, paramiko.BadHostKeyException) and is_revoked(client.known, exc.key):
            exc = RevokedHostKey(client.key_name, exc.key)
        if isinstance(exc, Exception):
            raise _connect_error(exc, label, target) from None
        raise


def jump_host(target: SshTarget, origin: str, hops: int) -> Host:
    """The first hop of the target's ProxyJump, as a host to connect to. ``hops`` jump
    hosts already stand before it on the way to ``origin``, the host the user named."""
    if hops >= MAX_JUMPS:
        raise ConfigError(f"its ProxyJump leads through more than {MAX_JUMPS} jump hosts "
                          "(a loop in ssh_config?)", host=origin,
                          fix="check the ProxyJump lines of your ssh config")
    name, user, port = parse_host_item(str(target.proxy_jump).split(",")[0], "ProxyJump")
    return Host(name=name, user=user, port=port)


def _login(target: SshTarget) -> str:
    return login_command(target.user, target.hostname, target.port)


def _port_option(target: SshTarget) -> str:
    return f"-p {target.port} " if target.port != 22 else ""


def _connect_error(exc: Exception, label: str, target: SshTarget) -> ConnectError:
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, RevokedHostKey):
        return ConnectError(
            f"host key of {exc.name} is REVOKED in known_hosts ({exc.fingerprint}); it is "
            "never accepted", host=label, kind=ConnectError.HOSTKEY_REVOKED,
            fix="give the host a new key (and a new certificate where a CA signs them); "
                "until then leave it out of the hosts")
    if isinstance(exc, UnknownHostKey) and exc.why:
        return ConnectError(
            f"host key of {exc.name} is not in known_hosts, and a CA is listed for it "
            f"(@cert-authority) but {exc.why} ({exc.fingerprint})", host=label,
            kind=ConnectError.HOSTKEY_UNKNOWN,
            fix="renew the host's certificate (ssh-keygen -s CA_KEY -h -n NAME), or check "
                f"the fingerprint and record its plain key: run `{_login(target)}` once")
    if isinstance(exc, UnknownHostKey):
        return ConnectError(
            f"host key of {exc.name} is not in known_hosts ({exc.fingerprint})", host=label,
            kind=ConnectError.HOSTKEY_UNKNOWN,
            fix=f"check the fingerprint, then run `{_login(target)}` once "
                "or pass --accept-new-host-keys to record it")
    if isinstance(exc, paramiko.BadHostKeyException):
        return ConnectError(
            f"host key CHANGED for {exc.hostname}: got {exc.key.get_name()} "
            f"{exc.key.fingerprint}, known_hosts has {exc.expected_key.fingerprint}; "
            "this can be an attack", host=label, kind=ConnectError.HOSTKEY_CHANGED,
            fix=f"if the host was reinstalled, run `{forget_key_command(target.hostname, target.port)}` and connect "
                "again; otherwise investigate")
    if isinstance(exc, paramiko.PasswordRequiredException):
        return ConnectError("the private key is encrypted and no passphrase is ever asked for",
                            host=label, kind=ConnectError.AUTH,
                            fix="load the key into ssh-agent (ssh-add) and run again")
    if isinstance(exc, paramiko.AuthenticationException):
        return ConnectError(
            f"{target.user}@{target.hostname} rejected our key (password-free login is not "
            "set up)", host=label, kind=ConnectError.AUTH,
            fix=f"run `ssh-copy-id {_port_option(target)}{target.user}@{target.hostname}`, or give the right "
                "--user / identity_file")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return ConnectError(f"ssh handshake with {target.hostname}:{target.port} timed out",
                            host=label, kind=ConnectError.TIMEOUT,
                            fix="check that sshd answers on that port")
    if isinstance(exc, OSError):
        return _socket_error(exc, label, target)
    return ConnectError(f"ssh to {target.hostname}:{target.port} failed: {exc}", host=label,
                        kind=ConnectError.PROTOCOL,
                        fix="check that an ssh server listens on that port")
