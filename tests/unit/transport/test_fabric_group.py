"""The fabric bridge (transport/fabric_bridge.py) without a host: which connections a group
holds, where they go, as whom, through which gateway, and which host keys they trust.
Connecting for real, and the refusals, are tested in tests/lab/test_fabric_bridge.py."""
import os
import subprocess
import sys

import pytest

from multihost.errors import ConfigError
from multihost.fanout import HostGroup
from multihost.hosts import Host, load_hosts
from multihost.transport import SshOptions
from multihost.transport.fabric_bridge import fabric_group
from multihost.transport.hostkeys import HostKeyPolicy
from multihost.transport.ssh import SshTransport

fabric = pytest.importorskip("fabric")

@pytest.fixture
def ssh_config(tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "hostkey")],
                   check=True)
    key = " ".join((tmp_path / "hostkey.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"[10.9.0.2]:2222 {key}\n")
    path = tmp_path / "ssh_config"
    path.write_text(
        "Host trainer-a\n    HostName 10.9.0.2\n    User trainer\n    Port 2222\n"
        f"    IdentityFile {tmp_path}/id_trainer\n    ProxyJump admin@bastion:2200\n"
        "Host bastion\n    HostName 10.9.0.1\n"
        f"Host *\n    UserKnownHostsFile {known}\n    GlobalKnownHostsFile /dev/null\n")
    return path


def group_of(ips, ssh_config, **kw):
    return fabric_group(load_hosts(ips, None), options=SshOptions(config_file=str(ssh_config)), **kw)


def test_connections_keep_the_given_order_users_ports_and_keys(ssh_config, tmp_path):
    group = group_of("10.9.0.5,trainer-a,ops@10.9.0.3:2022", ssh_config)
    assert isinstance(group, fabric.ThreadingGroup)
    assert [(c.original_host, c.host, c.user, c.port) for c in group] == [
        ("10.9.0.5", "10.9.0.5", os.environ.get("USER") or "root", 22),
        ("trainer-a", "10.9.0.2", "trainer", 2222),
        ("10.9.0.3", "10.9.0.3", "ops", 2022)]
    assert [c.multihost_host.rank for c in group] == [0, 1, 2]
    assert group[1].connect_kwargs["key_filename"] == [f"{tmp_path}/id_trainer"]
    assert group[1].connect_kwargs["look_for_keys"] is False


def test_proxyjump_becomes_a_gateway_that_is_checked_too(ssh_config):
    behind, direct = group_of("trainer-a,10.9.0.5", ssh_config)
    gateway = behind.gateway
    assert isinstance(gateway, type(behind))
    assert (gateway.original_host, gateway.host, gateway.user, gateway.port) == \
        ("bastion", "10.9.0.1", "admin", 2200)
    assert isinstance(gateway.client._policy, HostKeyPolicy)
    assert direct.gateway is False  # and fabric did not derive one of its own


def test_every_connection_trusts_the_known_hosts_files_of_the_ssh_transport(ssh_config, tmp_path):
    group = group_of("trainer-a,10.9.0.5", ssh_config)
    for connection in group:
        policy = connection.client._policy
        # multihost's policy, not fabric's AutoAddPolicy: unknown keys refused...
        assert isinstance(policy, HostKeyPolicy) and policy.accept_new is False
        assert policy.record_file == str(tmp_path / "known_hosts")
    assert group[0].client.get_host_keys().lookup("[10.9.0.2]:2222") is not None
    # ...unless accept-new is asked, here or in the options
    accepting = group_of("10.9.0.5", ssh_config, accept_new_host_keys=True)
    assert accepting[0].client._policy.accept_new is True
    cluster = HostGroup(load_hosts("10.9.0.5", None),
                      SshOptions(config_file=str(ssh_config), accept_new_host_keys=True))
    assert fabric_group(cluster)[0].client._policy.accept_new is True


def test_strict_host_key_checking_no_in_ssh_config_acts_as_accept_new(tmp_path):
    path = tmp_path / "ssh_config"
    path.write_text(f"Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile {tmp_path}/kh\n")
    policy = group_of("10.9.0.5", path)[0].client._policy
    assert policy.accept_new is True  # as on the SSH transport: recorded, and a changed key
    assert policy.record_file == f"{tmp_path}/kh"  # is still refused by paramiko itself


def test_a_serial_group_on_request_and_the_users_fabric_config_kept(ssh_config, tmp_path):
    other = tmp_path / "fabric_ssh_config"
    other.write_text("Host 10.9.0.5\n    HostName 10.9.9.9\n    User intruder\n")
    config = fabric.Config(overrides={"run": {"echo": True}}, runtime_ssh_path=str(other))
    group = group_of("10.9.0.5,trainer-a", ssh_config, serial=True, config=config)
    assert isinstance(group, fabric.SerialGroup)
    assert group[0].config.run.echo is True
    # where to connect is resolved once, by multihost: fabric's own ssh config is not applied
    assert (group[0].host, group[0].user) == ("10.9.0.5", os.environ.get("USER") or "root")
    assert group[1].host == "10.9.0.2"


def test_without_fabric_one_line_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "fabric", None)  # import fabric -> ImportError
    with pytest.raises(ConfigError) as caught:
        fabric_group(load_hosts("10.9.0.5", None))
    assert str(caught.value) == ("fabric is not installed (the fabric bridge is an optional "
                                 "extra) (fix: pip install 'multihost[fabric]')")


@pytest.mark.parametrize("connect", ["fabric", "ssh-transport"])
def test_a_proxyjump_loop_is_one_line_naming_the_host(tmp_path, connect):
    """Both ways of connecting share the jump-host resolution; a loop used to recurse
    until Python's RecursionError, a traceback. Refused before any socket is opened."""
    path = tmp_path / "ssh_config"
    path.write_text("Host a\n    ProxyJump b\nHost b\n    ProxyJump a\n")
    with pytest.raises(ConfigError) as caught:
        if connect == "fabric":
            group_of("a", path)
        else:
            SshTransport.connect(Host(name="a"), SshOptions(config_file=str(path)))
    assert str(caught.value) == ("a: its ProxyJump leads through more than 8 jump hosts (a loop "
                                 "in ssh_config?) (fix: check the ProxyJump lines of your ssh "
                                 "config)")


def test_no_hosts_or_bare_names_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="needs multihost hosts, and none were given"):
        fabric_group(())
    with pytest.raises(ConfigError, match="needs multihost hosts, and got str"):
        fabric_group(["10.9.0.5"])
