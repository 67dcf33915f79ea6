"""The inventory: order is rank, and every bad input is one line naming where and why."""
import textwrap

import pytest

from multihost.errors import ConfigError
from multihost.host_parsing import parse_ips
from multihost.hosts import HostOptions, load_hosts


def hostfile(tmp_path, text):
    path = tmp_path / "hosts.ini"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_ips_keep_the_given_order_as_node_rank():
    hosts = load_hosts("10.0.0.9,10.0.0.2,gpu-a", None)
    assert [h.name for h in hosts] == ["10.0.0.9", "10.0.0.2", "gpu-a"]
    assert [h.rank for h in hosts] == [0, 1, 2]


def test_ips_items_carry_user_port_and_ipv6():
    hosts = load_hosts("alice@10.0.0.1:2222,[fe80::1]:22,fe80::2,node3", None)
    assert (hosts[0].user, hosts[0].name, hosts[0].port) == ("alice", "10.0.0.1", 2222)
    assert (hosts[1].name, hosts[1].port) == ("fe80::1", 22)
    assert (hosts[2].name, hosts[2].port) == ("fe80::2", None)
    assert hosts[0].label == "10.0.0.1:2222"


def test_no_hosts_means_this_machine():
    assert [h.name for h in load_hosts(None, None)] == ["127.0.0.1"]


@pytest.mark.parametrize("ips, words", [
    ("", ["--ips is empty"]),
    ("a,,b", ["item 2", "empty host name"]),
    ("a, b", ["item 2", "white space"]),
    ("a:0", ["item 1", "port '0'"]),
    ("a:70000", ["port '70000'"]),
    ("a:ssh", ["port 'ssh'"]),
    ("a,b,a", ["item 3", "listed twice", "item 1"]),
    ("[fe80::1", ["without ']'"]),
    ("[nothex::zz]:22", ["not a valid IPv6"]),
    ("fe80::zz", ["not a valid IPv6"]),
    ("@host", ["not user@host"]),
    ("a;rm -rf", ["white space"]),
    ("a;b", ["not a host name"]),
    ("$(reboot)", ["not a host name"]),
    ("-oProxyCommand=x", ["not a host name"]),
])
def test_bad_ips_name_the_item_and_the_fix(ips, words):
    with pytest.raises(ConfigError) as info:
        load_hosts(ips, None)
    message = str(info.value)
    assert "\n" not in message and "fix:" in message
    for word in words:
        assert word in message


def test_hostfile_defaults_and_overrides(tmp_path):
    path = hostfile(tmp_path, """\
        # a comment
        [defaults]
        user = trainer
        python = /opt/venv/bin/python
        gpus = 0,1
        data = /data/a

        [10.0.0.2]
        gpus = 0,1,2,3
        data = /data/b

        [10.0.0.1:2200]
        iface = ib0
        """)
    hosts = load_hosts(None, path)
    assert [h.name for h in hosts] == ["10.0.0.2", "10.0.0.1"]
    assert hosts[0].gpus == (0, 1, 2, 3) and hosts[1].gpus == (0, 1)
    assert hosts[0].data == ("/data/a", "/data/b") and hosts[1].data == ("/data/a",)
    assert hosts[1].port == 2200 and hosts[1].iface == "ib0"
    assert all(h.user == "trainer" and h.python == "/opt/venv/bin/python" for h in hosts)


def test_command_line_flags_beat_the_hostfile(tmp_path):
    path = hostfile(tmp_path, "[defaults]\nuser = a\n[h1]\nuser = b\n[h2]\n")
    hosts = load_hosts(None, path, HostOptions(user="c", workdir="/w", python="py"))
    assert {h.user for h in hosts} == {"c"}
    assert {h.workdir for h in hosts} == {"/w"} and {h.python for h in hosts} == {"py"}


def test_two_projects_sharing_a_hostfiles_workdir_get_a_directory_each(tmp_path):
    from multihost.job import workdir_for

    path = hostfile(tmp_path, "[defaults]\nworkdir = /root/work\n[h1]\n[h2]\nworkdir = /scratch/{project}-runs\n")
    h1, h2 = load_hosts(None, path)
    assert [workdir_for(h1, str(tmp_path / p)) for p in ("bert", "resnet")] == \
        ["/root/work/bert", "/root/work/resnet"]
    assert workdir_for(h2, str(tmp_path / "bert")) == "/scratch/bert-runs"
    exact, = load_hosts(None, hostfile(tmp_path, "[h1]\n"), HostOptions(workdir="/root/work"))
    assert workdir_for(exact, str(tmp_path / "bert")) == "/root/work"   # --workdir: as typed
    # a hostfile that names the project's own directory, or the code's path on a shared
    # filesystem, is that directory, not a base
    named, = load_hosts(None, hostfile(tmp_path, "[defaults]\nworkdir = /data/bert\n[h1]\n"))
    assert workdir_for(named, str(tmp_path / "bert")) == "/data/bert"
    assert workdir_for(named, str(tmp_path / "gpt")) == "/data/bert/gpt"
    shared, = load_hosts(None, hostfile(tmp_path, f"[defaults]\nworkdir = {tmp_path}\n[h1]\n"))
    assert workdir_for(shared, str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize("text, words", [
    ("[h1]\ngpu = 0\n", [":2:", "unknown key 'gpu'", "keys are"]),
    ("[h1]\nport = 99999\n", [":2:", "port '99999'"]),
    ("[h1]\nport 22\n", [":2:", "expected 'key = value'"]),
    ("user = x\n[h1]\n", [":1:", "outside any section"]),
    ("[h1\n", [":1:", "bad section"]),
    ("[h1]\n[defaults]\nuser = x\n", [":2:", "must come before"]),
    ("[h1]\n[h1]\n", [":2:", "listed twice", ":1"]),
    ("# nothing\n", ["no hosts"]),
    ("[h1]\ngpus = 0,x\n", [":2:", "gpu 'x'"]),
    ("[h1]\ngpus = 1,1\n", [":2:", "listed twice"]),
    ("[h1]\nuser =\n", [":2:", "user is empty"]),
    ("[h 1]\n", [":1:", "white space"]),
])
def test_bad_hostfiles_name_the_line(tmp_path, text, words):
    path = hostfile(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_hosts(None, path)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_missing_hostfile_and_both_sources(tmp_path):
    with pytest.raises(ConfigError, match="cannot read hostfile"):
        load_hosts(None, str(tmp_path / "nope.ini"))
    with pytest.raises(ConfigError, match="both --ips and --hostfile"):
        load_hosts("a", str(tmp_path / "nope.ini"))


def test_example_hostfile_parses():
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "hosts.example.ini"
    hosts = load_hosts(None, str(example))
    assert len(hosts) >= 2 and hosts[0].rank == 0


def test_parse_ips_returns_entries_in_order():
    assert [e["name"] for e in parse_ips("b,a")] == ["b", "a"]
