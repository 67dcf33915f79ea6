"""Hostfiles as other launchers write them, GPU ranges, host subsets, and .env files."""
from __future__ import annotations

import pytest

from multihost.run import env as run_env
from multihost.errors import ConfigError
from multihost.host_parsing import parse_gpu_ids
from multihost.hosts import load_hosts, select_hosts
from multihost.job import JobOptions
from multihost.nodeset import expand, fold


def test_gpu_ranges_as_multihost_prints_them():
    assert parse_gpu_ids("0-3", "--gpus") == (0, 1, 2, 3)
    assert parse_gpu_ids("0-1,4,6-7", "--gpus") == (0, 1, 4, 6, 7)
    with pytest.raises(ConfigError, match="gpu 2 is listed twice"):
        parse_gpu_ids("0-3,2", "--gpus")
    with pytest.raises(ConfigError, match="backwards"):
        parse_gpu_ids("3-0", "--gpus")


def test_deepspeed_hostfile_slots_are_processes_per_host(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# DeepSpeed\nworker-1 slots=4\nworker-2 slots=2  # smaller\n")
    hosts = load_hosts(None, str(path))
    assert [(h.name, h.rank, h.slots) for h in hosts] == [("worker-1", 0, 4), ("worker-2", 1, 2)]
    job = JobOptions()
    assert [job.nproc_for(h) for h in hosts] == [4, 2]
    assert JobOptions(nproc_per_node=1).nproc_for(hosts[0]) == 1  # the flag still wins


def test_machinefile_of_bare_names_and_ini_gpus_range(tmp_path):
    flat = tmp_path / "machines"
    flat.write_text("node1\nnode2 slots=2\nnode3\n")
    assert [h.name for h in load_hosts(None, str(flat))] == ["node1", "node2", "node3"]
    ini = tmp_path / "hosts.ini"
    ini.write_text("[defaults]\ngpus = 0-3\n[10.0.0.1]\n[10.0.0.2]\nslots = 2\n")
    hosts = load_hosts(None, str(ini))
    assert hosts[0].gpus == (0, 1, 2, 3) and hosts[1].slots == 2


@pytest.mark.parametrize("text, words", [
    ("a slots=2 max_slots=4\n", ["hostfile:1", "launcher options", "NAME slots=N"]),
    ("a slots=0\n", ["hostfile:1", "slots '0'"]),
    ("a slots=four\n", ["hostfile:1", "slots 'four'"]),
    ("[a]\nb\n", ["hostfile:2", "expected 'key = value'"]),
])
def test_other_launchers_lines_refused_with_a_hint(tmp_path, text, words):
    path = tmp_path / "hostfile"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_hosts(None, str(path))
    for word in words:
        assert word in str(caught.value)


def test_node_sets_expand_as_clush_writes_them():
    assert expand("10.0.0.[1-3],gpu[08-10]") == [
        "10.0.0.1", "10.0.0.2", "10.0.0.3", "gpu08", "gpu09", "gpu10"]
    assert expand("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    names = ["node01", "node02", "node03", "node07"]
    assert expand(fold(names)) == names
    for bad in ("a[1-", "a]", "a,,b", "a[x]", "a[3-1]"):
        with pytest.raises(ConfigError, match="--include"):
            expand(bad, "--include")


def test_include_exclude_keep_order_and_renumber_ranks():
    hosts = load_hosts("10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4", None)
    kept = select_hosts(hosts, "10.0.0.[4,2]", None)
    assert [(h.name, h.rank) for h in kept] == [("10.0.0.2", 0), ("10.0.0.4", 1)]
    kept = select_hosts(hosts, "10.0.0.[1-3]", "10.0.0.1")
    assert [(h.name, h.rank) for h in kept] == [("10.0.0.2", 0), ("10.0.0.3", 1)]
    with pytest.raises(ConfigError, match=r"--exclude: 10.0.0.9 is not one of the hosts"):
        select_hosts(hosts, None, "10.0.0.9")
    with pytest.raises(ConfigError, match="leave no host"):
        select_hosts(hosts, None, "10.0.0.[1-4]")


def test_env_file_export_quotes_and_bom_read_with_dotenv(tmp_path):
    path = tmp_path / ".env"
    path.write_bytes("\ufeffexport WANDB_PROJECT=det\nMSG=\"a # b\"  # note\n"
                     "Q='$HOME stays'\nMULTI=\"one\ntwo\"\n".encode())
    assert run_env.parse_env_file(str(path)) == [
        ("WANDB_PROJECT", "det"), ("MSG", "a # b"), ("Q", "$HOME stays"), ("MULTI", "one\ntwo")]


def test_env_file_bad_line_never_shows_a_value(tmp_path):
    path = tmp_path / ".env"
    path.write_text("OK=1\nAPI_TOKEN hunter22\n")
    with pytest.raises(ConfigError) as caught:
        run_env.parse_env_file(str(path))
    assert ".env:2" in str(caught.value) and "hunter22" not in str(caught.value)
