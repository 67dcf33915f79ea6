"""A fabric group from multihost's hosts, for users who script their machines with fabric.

fabric's ``Connection`` accepts any host key (it installs paramiko's ``AutoAddPolicy``
and may rewrite ``~/.ssh/known_hosts``), which is why multihost's own transport uses
paramiko directly. The connections handed out here are fabric connections whose login is
multihost's: the same resolution of each host (``ssh_login.resolve_target``: the hostfile's or
``--ips``' user, port and identity file over ssh_config's User, Port, IdentityFile,
ProxyJump, known-hosts files and StrictHostKeyChecking), the same client
(``ssh_login.checking_client``: those known_hosts files read only, an unknown key refused
unless accept-new, a changed key always refused) and the same login and errors
(``ssh_login.login``: one ``ConnectError`` line naming the host, the cause and the fix). A
ProxyJump becomes the connection's fabric ``gateway``, itself such a connection.

Everything else is plain fabric: ``run``, ``sudo``, ``put``, ``get``, groups and their
``GroupResult``. fabric is an optional extra (``pip install 'multihost[fabric]'``) and is
imported only here, only when a group is asked for.
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Optional

from ..errors import ConfigError
from ..hosts import Host
from .base import SshOptions

INSTALL_FIX = "pip install 'multihost[fabric]'"


def fabric_group(hosts: Any, accept_new_host_keys: bool = False, *,
                 options: Optional[SshOptions] = None, serial: bool = False,
                 config: Any = None) -> Any:
    """A ``fabric.ThreadingGroup`` (``serial=True``: a ``SerialGroup``) of connections to
    ``hosts`` in node-rank order, checked and logged in as multihost connects.

    ``hosts`` is a tuple of ``Host`` (``multihost.hosts.load_hosts``) or a ``HostGroup``,
    whose own ssh options are then used. ``accept_new_host_keys`` records unknown host keys
    (like ``--accept-new-host-keys``); a changed key is refused whatever is asked.
    ``config`` is an optional ``fabric.Config`` for what fabric itself does (echo, sudo
    password, ...); where and as whom to connect always comes from multihost. Connections
    open on first use; each carries its ``Host`` as ``multihost_host``.
    """
    fabric = _import_fabric()
    records = tuple(getattr(hosts, "hosts", hosts))
    strangers = [type(item).__name__ for item in records if not isinstance(item, Host)]
    if not records or strangers:
        got = f"got {', '.join(sorted(set(strangers)))}" if strangers else "none were given"
        raise ConfigError(f"a fabric group needs multihost hosts, and {got}",
                          fix="pass multihost.hosts.load_hosts(ips, hostfile) or a HostGroup")
    options = options or getattr(hosts, "options", None) or SshOptions()
    if accept_new_host_keys:
        options = replace(options, accept_new_host_keys=True)
    from .ssh_login import load_ssh_config  # imports paramiko

    ssh_config = load_ssh_config(options.config_file)
    fabric_config = _fabric_config(fabric, config)
    connections = [_connection(host, options, ssh_config, fabric_config) for host in records]
    group_class = fabric.SerialGroup if serial else fabric.ThreadingGroup
    return group_class.from_connections(connections)


def _import_fabric() -> Any:
    try:
        import fabric
    except ImportError:
        raise ConfigError("fabric is not installed (the fabric bridge is an optional extra)",
                          fix=INSTALL_FIX) from None
    return fabric


def _fabric_config(fabric: Any, config: Any) -> Any:
    """The user's fabric config (or fabric's defaults) with no ssh_config of its own:
    hosts arrive resolved, and fabric must not map a name a second time."""
    from paramiko import SSHConfig

    if config is None:
        return fabric.Config(ssh_config=SSHConfig())
    config = config.clone(into=fabric.Config) if not isinstance(config, fabric.Config) \
        else config.clone()
    config.base_ssh_config = SSHConfig()
    return config


def _connection(host: Host, options: SshOptions, ssh_config: Any, fabric_config: Any,
                origin: Optional[str] = None, hops: int = 0) -> Any:
    """A checked connection to host; its ProxyJump, recursively, as its gateway (the
    same hops, and the same loop guard, as the SSH transport's)."""
    from .ssh_login import jump_host, resolve_target

    target = resolve_target(host, options, ssh_config)
    gateway = None
    if target.proxy_jump:
        origin = origin or host.label
        gateway = _connection(jump_host(target, origin, hops), options, ssh_config,
                              fabric_config, origin, hops + 1)
    return _checked_connection_class()(host, target, options, fabric_config, gateway)


@functools.lru_cache(maxsize=None)
def _checked_connection_class() -> type:
    """Defined on first use, so that importing this module never imports fabric."""
    fabric = _import_fabric()
    from . import ssh_login

    class CheckedConnection(fabric.Connection):
        """A fabric Connection that connects the way multihost's SSH transport does."""

        # Declared here: invoke stores an attribute the class lacks in the config that
        # every connection of the group shares, not on the connection.
        multihost_host: Optional[Host] = None
        _target: Any = None
        _keepalive: int = 0

        def __init__(self, host: Host, target: Any, options: SshOptions, config: Any,
                     gateway: Optional["CheckedConnection"]):
            super().__init__(
                target.hostname, user=target.user, port=target.port, config=config,
                gateway=gateway or False, forward_agent=False,
                connect_timeout=max(1, round(target.connect_timeout)),
                connect_kwargs={"key_filename": list(target.identity_files),
                                "look_for_keys": not target.identity_files,
                                "allow_agent": target.use_agent})
            self.original_host = host.name
            self.multihost_host = host
            self._target = target
            self._keepalive = options.keepalive
            # fabric's own client has AutoAddPolicy: replace it before anything connects.
            self.client = ssh_login.checking_client(target)

        def open(self) -> None:
            if self.is_connected:
                return None
            label = self.multihost_host.label
            sock = self.open_gateway() if self.gateway \
                else ssh_login.open_socket(self._target, label)
            ssh_login.login(self.client, self._target, sock, label)
            self.transport = self.client.get_transport()
            self.transport.set_keepalive(self._keepalive)
            return None

        def open_gateway(self) -> Any:
            self.gateway.open()
            return ssh_login.open_jump_channel(self.gateway.transport, self._target,
                                         self.multihost_host.label)

        def close(self) -> None:
            super().close()
            if self.gateway:
                self.gateway.close()

    return CheckedConnection


__all__ = ["fabric_group", "INSTALL_FIX"]
