"""Everyday use: `multihost ssh`, shell completion, and the README's one-minute try."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multihost.errors import ConfigError
from multihost.hosts import Host
from multihost.run.records import NodeRecord, RunRecord, host_to_dict, save_run
from multihost.commands.ssh import find_node, shell_argv
from multihost.transport import SshOptions

REPO = Path(__file__).resolve().parents[3]
HOSTS = (Host("198.18.0.11", 0, user="alice", port=2222, identity_file="~/.ssh/lab"),
         Host("198.18.0.12", 1))


def record(run_id="20260101-000000-abcd"):
    nodes = tuple(NodeRecord(h.rank, host_to_dict(h), h.label, h.name, 2, h.rank * 2,
                             workdir=f"/srv/job {h.rank}") for h in HOSTS)
    return RunRecord(run_id, 0.0, nodes, ("train.py",), "torchrun", "")


def test_ssh_finds_a_host_by_global_rank_or_by_name():
    run = record()
    assert find_node(run, "3").label == "198.18.0.12"
    assert find_node(run, "0").label == "198.18.0.11:2222"
    assert find_node(run, "198.18.0.11").node_rank == 0
    with pytest.raises(ConfigError, match="has no rank 4: its ranks are 0-3"):
        find_node(run, "4")
    with pytest.raises(ConfigError, match="has no host 'h9'"):
        find_node(run, "h9")


def test_ssh_opens_a_login_shell_in_the_workdir_with_multihosts_own_options():
    argv = shell_argv(HOSTS[0], SshOptions(), "/srv/job 0")
    assert argv[0] == "ssh" and "-t" in argv and "-T" not in argv
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    assert argv[argv.index("-l") + 1] == "alice" and argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-i") + 1] == os.path.expanduser("~/.ssh/lab")
    assert argv[-2:] == ["198.18.0.11", "cd '/srv/job 0' && exec \"${SHELL:-/bin/sh}\" -l"]


def complete(line, home):
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "_ARGCOMPLETE": "1",
           "_ARGCOMPLETE_IFS": "\n", "COMP_LINE": line, "COMP_POINT": str(len(line))}
    out = subprocess.run([sys.executable, "-c", "import os; os.dup2(1, 8); os.dup2(2, 9); "
                          "from multihost.cli import main; main()"],
                         env=env, capture_output=True, text=True, timeout=60)
    return [word.strip() for word in out.stdout.split("\n")]  # a lone answer ends in a space


def test_tab_completes_commands_run_ids_ranks_and_hostfile_hosts(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    save_run(record("20260101-000000-abcd"))
    save_run(record("20260102-000000-ef01"), make_last=True)
    assert {"status", "stop", "ssh"} <= set(complete("multihost s", tmp_path))
    assert complete("multihost status 2026010", tmp_path)[:2] == \
        ["20260102-000000-ef01", "20260101-000000-abcd"]
    assert {"0", "3", "198.18.0.12"} <= set(complete("multihost ssh ", tmp_path))
    hostfile = tmp_path / "hosts.ini"
    hostfile.write_text("[198.18.0.21]\n[198.18.0.22]\n")
    assert complete(f"multihost check --hostfile {hostfile} --ips 198.18.0.21,", tmp_path) == \
        ["198.18.0.21,198.18.0.22"]


def test_tab_after_launcher_offers_the_built_in_launchers_then_files(tmp_path):
    (tmp_path / "pd.tmpl").write_text("")
    assert complete("multihost run --launcher pa", tmp_path) == ["paddle", "paddle_ps"]
    assert complete(f"multihost run --launcher {tmp_path}/p", tmp_path) == [f"{tmp_path}/pd.tmpl"]


def test_completion_prints_the_shell_code():
    out = subprocess.run([sys.executable, "-m", "multihost", "completion", "bash"],
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "complete " in out.stdout and "multihost" in out.stdout


def test_the_readme_says_how_to_try_it_in_one_minute_before_the_lab():
    text = (REPO / "README.md").read_text()
    one_minute = text.index("multihost run --nproc_per_node 2 -- examples/train_ddp.py")
    assert one_minute < text.index("scripts/demo.sh")
