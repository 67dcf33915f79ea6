"""The lab's pure parts: addresses, names, file texts, share paths, the CLI's parsing.
No root, no namespaces."""
from __future__ import annotations

import argparse
import os
import socket

import pytest

from multihost.commands import lab as lab_command
from multihost.errors import ConfigError, LabError
from multihost.lab import config, hosts, init, probe, procs


def test_addresses_and_names():
    assert config.host_address(1) == "198.18.0.11"
    assert config.host_address(64) == "198.18.0.74"
    for bad in (0, 65):
        with pytest.raises(LabError):
            config.host_address(bad)
    assert config.ctl_netns("mht1") == "mht1-ctl"
    assert config.host_netns("mht1", 3) == "mht1-h3"
    assert config.CTL_ADDRESS == "198.18.0.1"
    assert all(config.host_address(i).startswith("198.18.0.") for i in range(1, 65))


def test_every_neighbour_is_written_up_front():
    # 64 hosts resolving 63 peers at once through one kernel's bridge lose ARP replies:
    # the lab gives each member a permanent entry for every other, with fixed MACs.
    lines = config.neighbour_lines(64, 5, "eth0")
    assert len(lines) == 64 and not any("198.18.0.15 " in l for l in lines)
    assert lines[0] == "neigh replace 198.18.0.1 lladdr 02:4d:48:00:00:01 dev eth0 nud permanent"
    assert "neigh replace 198.18.0.74 lladdr 02:4d:48:00:00:4a dev eth0 nud permanent" in lines
    assert len(config.neighbour_lines(64, 0, "br0")) == 64
    assert len({config.host_mac(i) for i in range(65)}) == 65


def test_lab_names():
    assert config.check_name("mht1a2b") == "mht1a2b"
    for bad in ["", "a-b", "-x", "x" * 25, "a b", "ä"]:
        with pytest.raises(LabError):
            config.check_name(bad)
    pattern = config.netns_pattern("mht")
    assert pattern.match("mht-ctl") and pattern.match("mht-h12")
    assert not pattern.match("mht2-h1") and not pattern.match("mht-h") and not pattern.match("xmht-ctl")
    with pytest.raises(LabError):
        config.check_count(65)


def test_rates():
    assert config.parse_rate("1gbit") == ("1gbit", 256 * 1024)  # the veth GSO floor
    assert config.parse_rate("10Gbit") == ("10gbit", 1_250_000)  # 1 ms of traffic
    assert config.parse_rate("100mbps")[0] == "100mbps"
    for bad in ["1 gbit", "fast", "1gbyte", "", "10bit"]:
        with pytest.raises(LabError):
            config.parse_rate(bad)


def test_sshd_config():
    lines = dict(line.split(None, 1) for line in config.sshd_config(2).splitlines()
                 if line and not line.startswith("#"))
    assert lines["ListenAddress"] == "198.18.0.12"
    assert lines["HostKey"] == "/run/multihost/ssh_host_ed25519_key"  # in the private /run
    expected = {"PermitRootLogin": "prohibit-password", "PasswordAuthentication": "no",
                "KbdInteractiveAuthentication": "no", "UsePAM": "no", "UseDNS": "no",
                "PrintMotd": "no", "MaxStartups": "200:30:400", "MaxSessions": "100"}
    assert {k: lines[k] for k in expected} == expected


def test_etc_hosts_and_resolv():
    text = config.etc_hosts(3)
    entries = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert ["127.0.0.1", "localhost"] in entries
    assert ["198.18.0.1", "ctl"] in entries
    assert [e for e in entries if e[1].startswith("h")] == [
        ["198.18.0.11", "h1"], ["198.18.0.12", "h2"], ["198.18.0.13", "h3"]]
    assert "127.0.1.1" not in text  # gloo would bind loopback (pitfall 7)
    assert "nameserver 127.0.0.1" in config.resolv_conf()


def test_known_hosts_and_client_config(tmp_path):
    pubs = ["ssh-ed25519 AAAAone h1-key\n", "ssh-ed25519 AAAAtwo h2-key\n"]
    assert config.known_hosts(2, pubs) == (
        "198.18.0.11,h1 ssh-ed25519 AAAAone\n198.18.0.12,h2 ssh-ed25519 AAAAtwo\n")
    text = config.ssh_client_config(tmp_path)
    assert f"IdentityFile {tmp_path}/id_ed25519" in text
    assert f"UserKnownHostsFile {tmp_path}/known_hosts" in text
    assert "StrictHostKeyChecking yes" in text and "BatchMode yes" in text


def test_hostfile():
    assert config.hostfile(2, "/venv/bin/python") == (
        "# written by `multihost lab up`\n[defaults]\nuser = root\npython = /venv/bin/python\n"
        "workdir = /root/work\n[198.18.0.11]\n[198.18.0.12]\n")


def test_share_paths(tmp_path):
    # Only what a host would not see anyway, parents before children, no duplicates.
    assert config.share_paths(["/work/repo", "/usr/lib"]) == []
    assert config.share_paths(["/tmp/venv", "/root/.pyenv/v/3.11", "/tmp/venv/lib",
                               "/tmp/venv"]) == ["/tmp/venv", "/root/.pyenv/v/3.11"]
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert config.share_paths([str(tmp_path / "link")]) == sorted(
        [str(tmp_path / "link"), str(real)])


def test_resolve_location():
    root = config.DEFAULT_ROOT
    assert config.resolve_location(None, None, {}) == (None, root / "mhlab")
    assert config.resolve_location("x1", None, {}) == ("x1", root / "x1")
    env = {"MULTIHOST_LAB_DIR": "/srv/lab"}
    assert config.resolve_location(None, None, env) == (None, config.Path("/srv/lab"))
    assert config.resolve_location("x1", None, env) == ("x1", root / "x1")  # a named lab wins
    assert config.resolve_location(None, "/d", env) == (None, config.Path("/d"))


def test_host_argv_enters_every_namespace():
    me = procs.proc(os.getpid())
    argv = hosts.host_argv(me, 1, ["ps", "-ef"])
    assert argv[:3] == ["nsenter", "-t", str(os.getpid())]
    assert {"-n", "-m", "-u", "-i", "-p"} <= set(argv)
    assert argv[-2:] == ["ps", "-ef"]
    with pytest.raises(LabError, match="not running"):
        hosts.host_argv(procs.Proc(me.pid, me.start + 1), 1, ["true"])  # a reused pid


def test_procs_alive():
    me = procs.proc(os.getpid())
    assert procs.alive(me) and me.pid in procs.ancestors()
    assert not procs.alive(procs.Proc(me.pid, me.start - 1))


def test_init_mountpoints(tmp_path):
    init.ensure_mountpoint(str(tmp_path / "a" / "b"), True)
    init.ensure_mountpoint(str(tmp_path / "f" / "file"), False)
    (tmp_path / "dangling").symlink_to(tmp_path / "target" / "resolv.conf")
    init.ensure_mountpoint(str(tmp_path / "dangling"), False)  # like resolv.conf -> /run/...
    assert (tmp_path / "a" / "b").is_dir() and (tmp_path / "f" / "file").is_file()
    assert (tmp_path / "target" / "resolv.conf").is_file()


def test_probe():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    closed = free.getsockname()[1]  # bound, never listening: refused
    try:
        open_ = f"127.0.0.1:{server.getsockname()[1]}"
        assert probe.wait_all([open_], 2.0) == []
        assert probe.wait_all([open_, f"127.0.0.1:{closed}"], 0.2) == [f"127.0.0.1:{closed}"]
    finally:
        server.close()
        free.close()


def _parse(argv):
    parser = argparse.ArgumentParser(prog="multihost")
    lab_command.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_parsing():
    args = _parse(["lab", "up", "4", "--rate", "1gbit", "--share", "/a", "--share", "/b"])
    assert (args.n, args.rate, args.share, args.name) == (4, "1gbit", ["/a", "/b"], None)
    args = _parse(["lab", "host", "2", "--name", "x", "--", "ps", "-ef", "--", "y"])
    assert lab_command._command(args) == ["ps", "-ef", "--", "y"] and args.name == "x"
    args = _parse(["lab", "exec", "--dir", "/d", "--", "ssh", "-o", "A=b", "h"])
    assert lab_command._command(args) == ["ssh", "-o", "A=b", "h"] and args.dir == "/d"
    assert lab_command._command(_parse(["lab", "exec", "hostname"])) == ["hostname"]
    with pytest.raises(ConfigError):
        lab_command._command(_parse(["lab", "exec", "--"]))
    assert "multihost lab exec -- ssh 198.18.0.11 hostname" in lab_command.EPILOG
