"""The reused OpenSSH connections (transport/openssh.py): which `ssh` they run, where
their sockets live, and that without a master nothing is reused and nothing waits."""
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from multihost.errors import ConfigError
from multihost.fanout import HostGroup
from multihost.hosts import Host
from multihost.transport import SshOptions
from multihost.transport import openssh


@pytest.fixture(autouse=True)
def home(monkeypatch):
    """A HOME short enough for a socket path (pytest's own tmp_path is too deep)."""
    short = tempfile.mkdtemp(prefix="mh-", dir="/tmp")
    monkeypatch.setenv("HOME", short)
    monkeypatch.delenv(openssh.PERSIST_ENV, raising=False)
    yield Path(short)
    shutil.rmtree(short, ignore_errors=True)


def option(argv, name):
    values = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "-o"
              and argv[i + 1].startswith(name + "=")]
    return values[-1].split("=", 1)[1] if values else None


def test_the_client_is_never_interactive_and_never_takes_a_changed_key():
    argv = openssh.client_argv(Host(name="gpu1"), SshOptions())
    assert option(argv, "BatchMode") == "yes"
    assert option(argv, "StrictHostKeyChecking") == "yes"
    assert "-l" not in argv and "-p" not in argv and "-F" not in argv  # ssh's config decides
    argv = openssh.client_argv(Host(name="gpu1", user="ai", port=2222, identity_file="~/k"),
                               SshOptions(accept_new_host_keys=True, config_file="/etc/alt"))
    assert option(argv, "StrictHostKeyChecking") == "accept-new"
    assert argv[argv.index("-l") + 1] == "ai" and argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-i") + 1] == os.path.expanduser("~/k")
    assert argv[argv.index("-F") + 1] == "/etc/alt"


def test_each_way_of_reaching_a_host_has_its_own_socket(home):
    a = openssh.control_path(Host(name="gpu1"), SshOptions())
    assert a.startswith(str(home / ".cache" / "multihost" / "ssh"))
    others = [openssh.control_path(Host(name="gpu2"), SshOptions()),
              openssh.control_path(Host(name="gpu1", user="bob"), SshOptions()),
              openssh.control_path(Host(name="gpu1", port=2222), SshOptions()),
              openssh.control_path(Host(name="gpu1"), SshOptions(accept_new_host_keys=True))]
    assert len({a, *others}) == 5
    assert openssh.control_path(Host(name="gpu1"), SshOptions()) == a


def test_a_home_too_deep_for_a_unix_socket_uses_a_private_directory_in_tmp(monkeypatch,
                                                                           tmp_path, home):
    monkeypatch.setenv("HOME", str(tmp_path / ("d" * 90)))
    monkeypatch.setattr(openssh, "CONTROL_DIRS", ("~/.cache/multihost/ssh", str(home / "u{uid}")))
    path = openssh.control_path(Host(name="gpu1"), SshOptions())
    assert path.startswith(str(home / f"u{os.getuid()}") + "/")
    monkeypatch.setattr(openssh, "CONTROL_DIRS", ("~/.cache/multihost/ssh",))
    assert openssh.control_path(Host(name="gpu1"), SshOptions()) is None   # nowhere: off


def test_a_directory_others_can_enter_or_a_link_is_never_used(home):
    open_dir = home / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    assert not openssh.private_dir(str(open_dir))
    os.symlink(str(home), str(home / "link"))
    assert not openssh.private_dir(str(home / "link"))
    assert openssh.private_dir(str(home / "fresh"))
    assert (os.stat(home / "fresh").st_mode & 0o777) == 0o700


def test_persist_setting(monkeypatch):
    assert openssh.persist_seconds() == openssh.DEFAULT_PERSIST
    monkeypatch.setenv(openssh.PERSIST_ENV, "0")
    assert openssh.control_path(Host(name="gpu1"), SshOptions()) is None   # off
    monkeypatch.setenv(openssh.PERSIST_ENV, "ten")
    with pytest.raises(ConfigError, match="MULTIHOST_CONTROL_PERSIST"):
        openssh.persist_seconds()


def test_without_a_master_nothing_is_reused_and_this_machine_never_is(home):
    cluster = HostGroup([Host(name="gpu1"), Host(name="127.0.0.1", rank=1)])
    assert cluster.reused(cluster.hosts[0]) is None      # no socket: the paramiko way
    assert cluster.reused(cluster.hosts[1]) is None      # local: no ssh at all
    cluster.leave_connection(cluster.hosts[1])
    assert not (home / ".cache" / "multihost" / "ssh").exists()


def test_a_socket_with_no_master_behind_it_fails_at_once_and_never_dials(home):
    host = Host(name="gpu1")
    path = openssh.control_path(host, SshOptions())
    os.makedirs(os.path.dirname(path), mode=0o700)
    open(path, "w").close()   # stands for a dead master's socket
    transport = openssh.MuxTransport.open(host, SshOptions())
    assert not transport.is_local
    result = transport.run("stat x", timeout=5)
    assert result.exit_code == 255   # the caller's cue to go the paramiko way


def bulk_target(port=22, accept_new=False):
    from multihost.transport.ssh_login import SshTarget

    return SshTarget(hostname="10.0.0.7", port=port, user="ubuntu", identity_files=(),
                     proxy_jump=None, connect_timeout=10, known_hosts=("/kh",),
                     accept_new=accept_new, use_agent=True)


class BulkTransport:
    def __init__(self, target):
        self.target = target
        self.host = Host(name="gpu7")


def test_the_bulk_stream_keeps_the_host_key_policy_whatever_the_users_config_says(monkeypatch):
    """`Host *` / `StrictHostKeyChecking no` in ~/.ssh/config must not let the bulk `ssh`
    take a changed key that the paramiko connection refused: the command line wins."""
    from multihost.sync.bulk import openssh_argv

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    argv = openssh_argv(BulkTransport(bulk_target()))
    assert option(argv, "StrictHostKeyChecking") == "yes"
    assert option(argv, "HostKeyAlias") == "10.0.0.7"   # the name paramiko checked
    argv = openssh_argv(BulkTransport(bulk_target(port=2222, accept_new=True)))
    assert option(argv, "StrictHostKeyChecking") == "accept-new"
    assert option(argv, "HostKeyAlias") == "[10.0.0.7]:2222"


def test_a_relay_hop_checks_the_next_hosts_key_strictly():
    from multihost.sync.transfer import hop_spec

    hop = hop_spec(Host(name="gpu7", rank=1), BulkTransport(bulk_target(port=2200)), "/w")
    assert option(hop["ssh"], "StrictHostKeyChecking") == "yes"
    assert option(hop["ssh"], "HostKeyAlias") == "[10.0.0.7]:2200"


def test_fix_hints_spell_the_port_when_it_is_not_22():
    import paramiko

    from multihost.transport.ssh_login import UnknownHostKey, _connect_error

    key = paramiko.Ed25519Key.from_private_key_file(str(make_key()))
    target = bulk_target(port=2222)
    unknown = _connect_error(UnknownHostKey("[10.0.0.7]:2222", key), "gpu7", target)
    assert "`ssh -p 2222 ubuntu@10.0.0.7`" in unknown.fix
    changed = _connect_error(paramiko.BadHostKeyException("[10.0.0.7]:2222", key, key),
                             "gpu7", target)
    assert "`ssh-keygen -R '[10.0.0.7]:2222'`" in changed.fix
    denied = _connect_error(paramiko.AuthenticationException(), "gpu7", target)
    assert "`ssh-copy-id -p 2222 ubuntu@10.0.0.7`" in denied.fix
    # on port 22 the hints stay the plain ones
    plain = _connect_error(paramiko.BadHostKeyException("10.0.0.7", key, key), "gpu7",
                           bulk_target())
    assert "`ssh-keygen -R 10.0.0.7`" in plain.fix


def make_key():
    import subprocess

    path = Path(tempfile.mkdtemp(prefix="mh-key-")) / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path
