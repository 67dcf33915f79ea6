"""Every fix names what to do so that, followed literally, it works: a command with the
hosts as the user gave them, or flags to add or drop, said for where the problem came
from (--gpus, the controller's CUDA_VISIBLE_DEVICES, the hostfile)."""
import argparse
import importlib.util
import io
import os
import sys

import pytest

from multihost.check.collective import LinkMatrix
from multihost.check.data_check import data_results
from multihost.check.fixes import actions, given_flags, hosts_flags
from multihost.check.judge import judge, make_survey, ping_matrix
from multihost.check.report import CheckReport
from multihost.data import DataReport, HostData, PathDiff
from multihost.hosts import Host
from multihost.job import JobOptions
from multihost.remote.check import python as ops_check_python
from multihost.views.check_view import render_plain
from test_check_samples import ADDRESSES, lab_probes, report_of, with_facts

IPS = "--ips=198.18.0.11,198.18.0.12"


def gpus_fix(job: JobOptions, hosts=None) -> str:
    probes = lab_probes(1, hosts)  # the lab has no nvidia-smi
    result = report_of(probes, job).hosts[0].result("gpus")
    assert result.detail.startswith("no nvidia-smi (no NVIDIA driver), but the job asks")
    return result.fix


def test_gpus_from_the_flag_on_a_cpu_host_say_drop_it_and_how_many_processes():
    assert actions(gpus_fix(JobOptions(gpus=(0, 1)))) == [
        ("drop", "--gpus"), ("add", "--nproc_per_node 2")]


def test_gpus_from_the_controllers_cuda_visible_devices_say_unset_it():
    fix = gpus_fix(JobOptions(gpus=(0, 1), gpus_from="CUDA_VISIBLE_DEVICES"))
    assert actions(fix) == [("run", "unset CUDA_VISIBLE_DEVICES"),
                            ("add", "--nproc_per_node 2")]
    assert "--gpus" not in fix


def test_gpus_from_the_hostfile_are_overridden_by_a_flag_and_a_given_count_is_kept():
    host = Host(ADDRESSES[0], python="/opt/venv/bin/python", gpus=(0,))
    assert actions(gpus_fix(JobOptions(), [host])) == [("add", "--gpus none")]
    assert actions(gpus_fix(JobOptions(gpus=(0, 1), nproc_per_node=2))) == [("drop", "--gpus")]


def test_a_busy_port_fix_adds_auto_first_and_names_the_kill_on_that_host():
    probes = lab_probes(2)
    probes[1] = with_facts(probes[1], ports={"busy": [{"port": 17001, "pid": 4242,
                                                       "command": "nc -l 17001"}]})
    fix = report_of(probes).hosts[1].result("ports").fix
    assert actions(fix) == [("add", "--start-port auto")]
    kill = fix.split(", or ")[1]
    assert kill.endswith("--include 198.18.0.12 -- kill 4242`")


def test_fix_commands_name_the_hosts_as_given():
    probes = lab_probes(2)
    probes[1] = with_facts(probes[1], leftovers=[{"run_id": "r1", "pids": [7]}])
    cluster = make_survey(probes, JobOptions(), 17000, ADDRESSES[0],
                           given="--hostfile 'my hosts.ini' --user alice")
    fix = judge(cluster)[1].result("leftovers").fix
    assert fix.endswith("run `multihost exec --hostfile 'my hosts.ini' --user alice "
                        "--include 198.18.0.12 -- kill 7`")


def test_given_flags_are_the_host_flags_of_the_command_line_quoted():
    args = argparse.Namespace(ips="a,b", hostfile=None, include=None, exclude="b", user="bob",
                              port=2222, identity="~/k ey", workdir=None, python=None,
                              ssh_config="~/.ssh/config", gpus="0,1")
    assert given_flags(vars(args)) == "--ips=a,b --exclude b --user bob --port 2222 -i '~/k ey'"


def test_hosts_flags_rebuild_the_ips_with_users_and_ports():
    hosts = [Host("a", rank=0, user="u", port=2222, python="/v/bin/python"),
             Host("b", rank=1, python="/v/bin/python")]
    assert hosts_flags(hosts) == "--ips=u@a:2222,b --python /v/bin/python"
    assert hosts_flags([Host("127.0.0.1")]) == ""  # this machine alone: no hosts to name


def test_a_differing_dataset_fix_syncs_it_on_the_same_hosts():
    diff = PathDiff("/root/data", "198.18.0.11", counts=(1, 0, 0), missing=("a.bin",))
    report = DataReport(("/root/data",), (HostData("198.18.0.11", 0, (), (PathDiff(
        "/root/data", "198.18.0.11"),)), HostData("198.18.0.12", 1, (), (diff,))))
    hosts = [Host(a, rank=i) for i, a in enumerate(ADDRESSES[:2])]
    result = data_results(report, hosts, ("/root/data",), IPS)[1]
    assert actions(result.fix) == [
        ("run", f"multihost sync {IPS} --data /root/data --sync-data --no-code")]
    # What `run` and `sync` raise says the same, with the report's hosts by default.
    assert actions(report.error().fix) == [
        ("run", f"multihost sync {IPS} --data /root/data --sync-data --no-code")]


def test_a_link_slow_once_is_not_slow_when_measured_again():
    labels = ("a", "b")
    slow = LinkMatrix(labels, ((None, 1e8), (1e9, None)), ((None, "eth0"), ("eth0", None)))
    again = LinkMatrix(labels, ((None, 9e8), (1e9, None)), ((None, "eth0"), ("eth0", None)))
    assert slow.best_of(again).rates == ((None, 9e8), (1e9, None))
    assert slow.best_of(LinkMatrix(labels, ((None, None), (None, None)),
                                   ((None, None), (None, None)), ("b: no reply",))).rates == \
        slow.rates


def make_env(root, name, torch=None, paddle=None):
    env = root / name
    (env / "bin").mkdir(parents=True)
    python = env / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    site = env / "lib" / "python3.11" / "site-packages"
    if torch:
        (site / "torch").mkdir(parents=True)
        (site / "torch" / "version.py").write_text(f"__version__ = '{torch}'\ncuda = None\n")
    if paddle:
        (site / "paddle" / "version").mkdir(parents=True)
        (site / "paddle" / "version" / "__init__.py").write_text(f"full_version = '{paddle}'\n")
    return str(python)


def test_the_host_probe_finds_a_venv_at_the_controllers_prefix_and_conda_envs(tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    venv = make_env(tmp_path / "opt", "venv", torch="2.3.1+cpu")
    conda = make_env(tmp_path / "miniconda3" / "envs", "pp", paddle="2.6.2")
    make_env(tmp_path / "miniconda3" / "envs", "bare")
    found = ops_check_python.framework_pythons(str(tmp_path / "opt" / "venv"), "/usr/bin/python3")
    assert found == [{"python": venv, "torch": "2.3.1+cpu"}, {"python": conda, "paddle": "2.6.2"}]
    # The job's own python is not offered again.
    assert ops_check_python.framework_pythons(str(tmp_path / "opt" / "venv"), venv) == \
        [{"python": conda, "paddle": "2.6.2"}]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch here")
def test_alone_the_job_python_is_this_one_when_python3_lacks_torch(tmp_path, monkeypatch):
    from multihost.local_python import local_default

    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.base_prefix + "/bin/python3")
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.setenv("PYTHONNOUSERSITE", "1")
    assert local_default() == sys.executable
    # A python3 in this very environment is kept as the user's own default.
    monkeypatch.setenv("PATH", os.path.join(sys.prefix, "bin"))
    if os.path.exists(os.path.join(sys.prefix, "bin", "python3")):
        assert local_default() == "python3"


def test_hosts_that_share_a_fix_on_that_host_are_named_as_one_node_set():
    probes = lab_probes()
    for i in (2, 3):
        python = dict(probes[i].facts["python"], executable="/usr/bin/python3")
        del python["torch"]
        probes[i] = with_facts(probes[i], python=python)
    cluster = make_survey(probes, JobOptions(), 17000, ADDRESSES[0], given="--hostfile h.ini")
    out = io.StringIO()
    render_plain(CheckReport(judge(cluster), 17000, ADDRESSES[0], ping_matrix(cluster)), out)
    fix = [line for line in out.getvalue().splitlines() if line.startswith("     fix: ")]
    assert fix == ["     fix: install torch==2.13.0 there: run `multihost exec --hostfile h.ini "
                   "--include '198.18.0.[13-14]' -- /usr/bin/python3 -m pip install "
                   "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu`"]
