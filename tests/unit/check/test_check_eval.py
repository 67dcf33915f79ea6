"""Judging facts into pass/warn/fail, from facts recorded on the 4 hosts of a real lab
(tests/unit/data/check/facts-lab-h*.json), each test changing what a user would meet:
a missing torch, a busy port, a host that can not be reached, a silent link..."""
import copy
import dataclasses
import json

import shlex

import pytest

from test_check_samples import (ADDRESSES, DATA, PYTHON, lab_facts, lab_probes, report_of, statuses,
                           with_facts)
from multihost.check.checks.network import choose_start_port
from multihost.check.fixes import actions
from multihost.check.judge import HostProbe, judge, make_survey, ping_matrix
from multihost.check.parsers import parse_torch_version
from multihost.check.report import FAIL, PASS, SKIP, WARN, CheckReport
from multihost.errors import ConnectError, RemoteError
from multihost.hosts import Host
from multihost.job import JobOptions

def test_the_recorded_lab_passes_every_check():
    report = report_of(lab_probes())
    assert report.ok
    for host in report.hosts:
        assert {r.status for r in host.results} == {PASS}, host.results
        assert host.iface == "eth0"
    assert report.hosts[0].result("rendezvous").detail == "listening on :17000; 3/3 hosts connected"
    assert report.hosts[1].result("software").detail == "Python 3.11.7, torch 2.13.0+cpu"
    assert report.ping_matrix.ok and report.error() is None


def test_a_python_without_torch_fails_that_host_and_names_the_version_to_install():
    probes = lab_probes()
    python = dict(probes[2].facts["python"], executable="/usr/bin/python3")
    del python["torch"]
    probes[2] = with_facts(probes[2], python=python)
    report = report_of(probes)
    assert statuses(report, "software") == {0: PASS, 1: PASS, 2: FAIL, 3: PASS}
    result = report.hosts[2].result("software")
    assert "/usr/bin/python3 has no torch" in result.detail
    assert "198.18.0.[11-12,14]" in result.detail
    # Nothing else on the host has torch: pip, on that host, from here.
    [(verb, command)] = actions(result.fix)
    assert verb == "run" and shlex.split(command) == [
        "multihost", "exec", "--ips=198.18.0.11,198.18.0.12,198.18.0.13,198.18.0.14",
        "--python", "/opt/venv/bin/python", "--workdir", "/root/work", "--include",
        "198.18.0.13", "--", "/usr/bin/python3", "-m", "pip", "install", "torch==2.13.0",
        "--index-url", "https://download.pytorch.org/whl/cpu"]
    assert not report.ok
    error = report.error()
    assert error.host == "198.18.0.13" and error.exit_code == 3


def test_a_python_without_torch_is_pointed_at_an_interpreter_there_that_has_it():
    probes = lab_probes()
    python = dict(probes[2].facts["python"], executable="/usr/bin/python3", others=[
        {"python": "/root/miniconda3/envs/old/bin/python", "torch": "1.13.1"},
        {"python": "/root/miniconda3/envs/my job/bin/python", "torch": "2.13.0+cpu"}])
    del python["torch"]
    probes[2] = with_facts(probes[2], python=python)
    result = report_of(probes).hosts[2].result("software")
    # The one with the others' version, quoted for the shell.
    assert actions(result.fix) == [("add", "--python '/root/miniconda3/envs/my job/bin/python'")]
    assert "(it has torch 2.13.0+cpu), or install torch==2.13.0 there: run `" in result.fix


def test_mixed_torch_versions_are_not_ready_listing_who_has_what():
    probes = lab_probes()
    python = copy.deepcopy(probes[3].facts["python"])
    python["torch"]["version_py"] = python["torch"]["version_py"].replace("2.13.0+cpu", "2.12.1+cpu")
    probes[3] = with_facts(probes[3], python=python)
    report = report_of(probes)
    assert statuses(report, "software") == {0: PASS, 1: PASS, 2: PASS, 3: FAIL}
    result = report.hosts[3].result("software")
    assert result.detail == ("torch differs: 2.13.0+cpu on 198.18.0.[11-13], 2.12.1+cpu on "
                             "198.18.0.14; mixed versions can hang or corrupt collectives")
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" \
        in result.fix
    assert not report.ok and report.error().host == "198.18.0.14"


def test_no_framework_anywhere_is_only_a_warning():
    probes = lab_probes(2)
    for i in range(2):
        python = dict(probes[i].facts["python"])
        del python["torch"]
        probes[i] = with_facts(probes[i], python=python)
    report = report_of(probes)
    assert statuses(report, "software") == {0: WARN, 1: WARN}


def test_a_busy_port_names_the_process_and_suggests_auto():
    probes = lab_probes()
    busy = {"busy": [{"port": 17001, "pid": 4242, "command": "python3 -m http.server 17001"}],
            "ephemeral": [32768, 60999]}
    probes[1] = with_facts(probes[1], ports=busy)
    report = report_of(probes)
    assert statuses(report, "ports") == {0: PASS, 1: FAIL, 2: PASS, 3: PASS}
    result = report.hosts[1].result("ports")
    assert result.detail == "port 17001 is in use by pid 4242 (python3 -m http.server 17001)"
    assert "--start-port auto" in result.fix


def test_ports_in_the_ephemeral_range_warn():
    probes = lab_probes(1)
    probes[0] = with_facts(probes[0], ports={"busy": [], "ephemeral": [1024, 65000]})
    report = report_of(probes)
    assert statuses(report, "ports") == {0: WARN}


def test_auto_start_port_goes_around_busy_ports_on_any_host():
    hosts = [Host(a, rank=i) for i, a in enumerate(ADDRESSES)]
    job = JobOptions(nproc_per_node=2, start_port=None)
    assert choose_start_port({0: [], 1: []}, hosts[:2], job) == 10000
    # 2 processes need 3 ports: 10000-10002. A listener on 10002 of the second host
    # pushes the range past it.
    assert choose_start_port({0: [10005], 1: [10002]}, hosts[:2], job) == 10006
    assert choose_start_port({0: list(range(10000, 20001))}, hosts[:1], job) is None


def test_no_free_range_fails_the_ports_check():
    report = report_of(lab_probes(2), JobOptions(start_port=None), start_port=None, auto=True)
    assert statuses(report, "ports") == {0: FAIL, 1: FAIL}
    assert not report.ok


def test_an_unreachable_host_fails_reach_and_ssh_and_skips_the_rest():
    probes = lab_probes()
    error = ConnectError("no answer from 198.18.0.13:22 within 2s", host="198.18.0.13",
                         kind=ConnectError.TIMEOUT, fix="check that the host is up")
    probes[2] = dataclasses.replace(probes[2], ssh_error=error, facts=None, rendezvous=None,
                                    reach={"rtt": None, "method": "icmp",
                                           "tcp": {"error": "timeout"}})
    for i in (0, 1, 3):  # nobody hears from it
        rtt = dict(probes[i].facts["ping"]["rtt"], **{ADDRESSES[2]: None})
        probes[i] = with_facts(probes[i], ping={"rtt": rtt, "method": "icmp"})
    report = report_of(probes)
    host = report.hosts[2]
    assert host.result("reach").status == FAIL and "tcp/22 timeout" in host.result("reach").detail
    assert host.result("ssh").status == FAIL and host.result("ssh").fix == "check that the host is up"
    assert {host.result(n).status for n in ("software", "ports", "disk", "leftovers")} == {SKIP}
    assert statuses(report, "ping") == {0: FAIL, 1: FAIL, 2: SKIP, 3: FAIL}
    assert report.hosts[0].result("ping").detail == "no echo from 198.18.0.13 (1 of 3 hosts)"
    assert sorted(report.ping_matrix.failed_pairs()) == [(0, 2), (1, 2), (3, 2)]
    assert report.ping_matrix.rows[2] is None


def test_a_helper_that_cannot_run_fails_software_with_its_fix():
    probes = lab_probes(2)
    error = RemoteError("python interpreter 'python3.12' not found", host="198.18.0.12",
                        fix="install python3 there, or give its path with --python")
    probes[1] = dataclasses.replace(probes[1], facts=None, facts_error=error, rendezvous=None)
    report = report_of(probes)
    result = report.hosts[1].result("software")
    assert result.status == FAIL and "python3.12" in result.detail and "--python" in result.fix
    assert report.hosts[1].result("disk").status == SKIP


def test_rendezvous_refused_on_one_host():
    probes = lab_probes()
    probes[3] = dataclasses.replace(probes[3], rendezvous={"ok": False, "error": "refused",
                                                           "text": "Connection refused"})
    report = report_of(probes)
    assert statuses(report, "rendezvous") == {0: PASS, 1: PASS, 2: PASS, 3: FAIL}
    result = report.hosts[3].result("rendezvous")
    assert result.detail == "198.18.0.11:17000 refused the connection"
    assert "allow TCP 17000" in result.fix


def test_a_first_host_that_cannot_listen_fails_there_and_skips_the_others():
    probes = lab_probes(3)
    probes[0] = dataclasses.replace(probes[0], rendezvous={
        "listening": False, "error": "Address already in use", "port": 17000, "accepted": []})
    for i in (1, 2):
        probes[i] = dataclasses.replace(probes[i], rendezvous={
            "ok": False, "error": "foreign", "text": "another program answers on this port"})
    report = report_of(probes)
    assert statuses(report, "rendezvous") == {0: FAIL, 1: SKIP, 2: SKIP}
    assert statuses(report, "ports")[0] == FAIL  # the port is taken, even if not by a listener we saw
    assert "could not listen on :17000" in report.hosts[1].result("rendezvous").detail


def test_a_loopback_first_host_is_refused_for_a_cluster():
    hosts = [Host("127.0.0.1", rank=0), Host(ADDRESSES[1], rank=1)]
    probes = lab_probes(2, hosts)
    cluster = make_survey(probes, JobOptions(), 17000, "127.0.0.1")
    report = CheckReport(judge(cluster), 17000, "127.0.0.1", ping_matrix(cluster))
    assert report.hosts[0].result("rendezvous").status == FAIL
    assert "other hosts can not reach" in report.hosts[0].result("rendezvous").detail


def test_hostname_on_loopback_warns_with_the_gloo_fix():
    probes = lab_probes()
    probes[1] = with_facts(probes[1], hostname={"hostname": "h2", "addresses": ["127.0.1.1",
                                                                             "198.18.0.12"]})
    report = report_of(probes)
    assert statuses(report, "iface") == {0: PASS, 1: WARN, 2: PASS, 3: PASS}
    result = report.hosts[1].result("iface")
    assert result.detail.startswith("hostname h2 resolves to 127.0.1.1")
    assert "GLOO_SOCKET_IFNAME=eth0" in result.fix
    assert report.iface_for(1) == "eth0"


def test_hostname_on_loopback_is_fine_for_a_single_host():
    probes = lab_probes(1)
    probes[0] = with_facts(probes[0], hostname={"hostname": "h1", "addresses": ["127.0.1.1"]})
    assert statuses(report_of(probes), "iface") == {0: PASS}


def test_interface_names_that_differ_are_flagged():
    probes = lab_probes(3)
    net = copy.deepcopy(probes[2].facts["net"])
    net["interfaces"]["ib0"] = net["interfaces"].pop("eth0")
    net["route_iface"] = "ib0"
    probes[2] = with_facts(probes[2], net=net)
    report = report_of(probes)
    assert statuses(report, "iface") == {0: PASS, 1: PASS, 2: WARN}
    assert report.hosts[2].result("iface").detail == \
        "interface names differ: eth0 on 198.18.0.[11-12], ib0 on 198.18.0.13"
    assert report.iface_for(2) == "ib0" and report.iface_for("198.18.0.12") == "eth0"


def test_an_iface_from_the_hostfile_that_does_not_exist_fails():
    hosts = [Host(a, rank=i, python=PYTHON, iface="ib0" if i == 1 else None)
             for i, a in enumerate(ADDRESSES[:2])]
    report = report_of(lab_probes(2, hosts))
    result = report.hosts[1].result("iface")
    assert result.status == FAIL and "ib0 (from the hostfile) does not exist" in result.detail


def gpu_probe(probe: HostProbe, smi: str, apps: str = "", torch_file: str = "torch-version-cu121.py.txt"):
    python = copy.deepcopy(probe.facts["python"])
    python["torch"]["version_py"] = (DATA / torch_file).read_text()
    gpus = {"code": 0, "out": (DATA / smi).read_text(), "err": "", "apps": apps}
    return with_facts(probe, gpus=gpus, python=python)


def test_gpus_requested_that_the_host_has():
    probes = [gpu_probe(lab_probes(1)[0], "nvidia-smi-gpus-a100x8.csv")]
    report = report_of(probes, JobOptions(gpus=(0, 1, 3)))
    result = report.hosts[0].result("gpus")
    assert result.status == PASS
    assert result.detail == "GPUs 0-1,3 of 8x NVIDIA A100-SXM4-80GB (80 GiB), driver 535.104.05"


def test_more_gpus_than_the_host_has_fails():
    probes = [gpu_probe(lab_probes(1)[0], "nvidia-smi-gpus-v100x4.csv")]
    report = report_of(probes, JobOptions(gpus=tuple(range(8))))
    result = report.hosts[0].result("gpus")
    assert result.status == FAIL and result.detail == "GPU 4-7 requested; this host has 4 (0-3)"


def test_a_gpu_in_use_by_another_process_warns():
    probes = [gpu_probe(lab_probes(1)[0], "nvidia-smi-gpus-a100x8.csv",
                        (DATA / "nvidia-smi-apps.csv").read_text())]
    result = report_of(probes, JobOptions(gpus=(2, 3))).hosts[0].result("gpus")
    assert result.status == WARN and "GPU 2 is in use by pid 48213" in result.detail
    # GPUs 0 and 1 are idle: asking for those is the fix that needs nothing stopped.
    assert actions(result.fix) == [("add", "--gpus 0,1")]
    assert result.fix.endswith("stop it: run `multihost exec --ips=198.18.0.11 --python "
                               "/opt/venv/bin/python --workdir /root/work --include "
                               "198.18.0.11 -- kill 48213`")
    assert report_of(probes, JobOptions(gpus=(0, 1))).hosts[0].result("gpus").status == PASS


def test_a_cpu_torch_with_gpus_requested_fails():
    probes = [gpu_probe(lab_probes(1)[0], "nvidia-smi-gpus-a100x8.csv",
                        torch_file="torch-version-cpu.py.txt")]
    result = report_of(probes, JobOptions(gpus=(0,))).hosts[0].result("gpus")
    assert result.status == FAIL and "CPU build" in result.detail


def test_gpus_requested_without_a_driver_fail_but_a_cpu_job_passes():
    probes = lab_probes(1)  # the lab has no nvidia-smi
    result = report_of(probes, JobOptions(gpus=(0, 1))).hosts[0].result("gpus")
    assert result.status == FAIL and "no nvidia-smi" in result.detail
    cpu = report_of(probes, JobOptions(nproc_per_node=2)).hosts[0].result("gpus")
    assert cpu.status == PASS and cpu.detail == "CPU job: 2 processes on 2 CPUs"
    crowded = report_of(probes, JobOptions(nproc_per_node=8)).hosts[0].result("gpus")
    assert crowded.status == WARN and "8 processes on 2 CPUs" in crowded.detail


def test_leftovers_of_an_earlier_run_fail_with_the_stop_command():
    probes = lab_probes(2)
    run = {"run_id": "20261121-101500-3f2a", "pids": [311, 312], "pgid": 311,
           "command": "python -m torch.distributed.run train.py"}
    probes[1] = with_facts(probes[1], leftovers=[run])
    result = report_of(probes).hosts[1].result("leftovers")
    assert result.status == FAIL
    assert result.detail.startswith("run 20261121-101500-3f2a still has 2 processes here")
    assert "multihost stop 20261121-101500-3f2a" in result.fix and "kill -TERM -- -311" in result.fix


def test_leftovers_of_a_run_this_controller_never_started_say_so():
    probes = lab_probes(2)
    run = {"run_id": "20261121-101500-3f2a", "pids": [311], "command": "python train.py"}
    probes[1] = with_facts(probes[1], leftovers=[run])
    for known, stop_here in ((["20261121-101500-3f2a"], True), (["20261120-090000-0000"], False)):
        cluster = make_survey(probes, JobOptions(), 17000, ADDRESSES[0], known_runs=known)
        result = judge(cluster)[1].result("leftovers")
        assert result.status == FAIL
        assert ("not started from this controller" in result.detail) is not stop_here
        assert (result.fix.startswith("stop it: run `multihost stop 20261121-101500-3f2a`")
                is stop_here)
        assert "--include 198.18.0.12 -- kill 311`" in result.fix


def test_the_same_machine_listed_twice_is_one_line_naming_both_entries():
    hosts = [Host("localhost", rank=0), Host("127.0.0.1", rank=1), Host(ADDRESSES[2], rank=2)]
    probes = lab_probes(3, hosts)
    for rank, machine in enumerate(["boot-a/net:[1]", "boot-a/net:[1]", "boot-b/net:[1]"]):
        hostname = dict(probes[rank].facts["hostname"], machine=machine)
        probes[rank] = with_facts(probes[rank], hostname=hostname)
    report = report_of(probes)
    assert [h.result("machine") is not None for h in report.hosts] == [False, True, False]
    result = report.hosts[1].result("machine")
    assert result.status == FAIL
    assert result.detail.startswith("127.0.0.1 is the same machine as localhost (rank 0)")
    assert "add `--exclude 127.0.0.1`" in result.fix
    assert report.hosts[1].result("ports").status == SKIP
    assert [r.name for r in report.hosts[0].results] == \
        [r.name for r in report.hosts[2].results]  # no column where every machine is one


@pytest.mark.parametrize("free,status", [(500 * 2 ** 20, FAIL), (3 * 2 ** 30, WARN),
                                         (80 * 2 ** 30, PASS)])
def test_free_disk_thresholds(free, status):
    probes = lab_probes(1)
    probes[0] = with_facts(probes[0], disk=dict(probes[0].facts["disk"], free=free))
    assert statuses(report_of(probes), "disk") == {0: status}


def test_a_read_only_workdir_fails():
    probes = lab_probes(1)
    probes[0] = with_facts(probes[0], disk=dict(probes[0].facts["disk"], writable=False))
    assert statuses(report_of(probes), "disk") == {0: FAIL}


def test_a_hung_probe_fails_its_check_and_only_that():
    probes = lab_probes(1)
    facts = copy.deepcopy(probes[0].facts)
    del facts["disk"]
    facts["timed_out"] = ["disk"]
    probes[0] = dataclasses.replace(probes[0], facts=facts)
    report = report_of(probes)
    result = report.hosts[0].result("disk")
    assert result.status == FAIL and "hung network mount" in result.detail
    assert report.hosts[0].result("software").status == PASS


def test_clock_skew_beyond_a_second_warns():
    probes = lab_probes(2)
    probes[1] = dataclasses.replace(probes[1], clock_skew=-3.4, clock_error=0.05)
    result = report_of(probes).hosts[1].result("clock")
    assert result.status == WARN and result.detail == "clock 3.4 s behind the controller"
    assert "NTP" in result.fix


def test_controller_reach_falls_back_to_tcp_and_says_so():
    probes = lab_probes(2)
    probes[1] = dataclasses.replace(probes[1], reach={"rtt": None, "method": None,
                                                      "tcp": {"ms": 0.4}})
    result = report_of(probes).hosts[1].result("reach")
    assert result.status == PASS
    assert result.detail == "tcp/22 answers in 0.40 ms (ICMP is not permitted on this controller)"


def test_json_has_rank_address_and_every_check():
    report = report_of(lab_probes(2))
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["ok"] is True and doc["start_port"] == 17000
    assert [(h["rank"], h["address"]) for h in doc["hosts"]] == [(0, "198.18.0.11"),
                                                                (1, "198.18.0.12")]
    names = [c["name"] for c in doc["hosts"][1]["checks"]]
    assert names == ["reach", "ssh", "software", "gpus", "ports", "rendezvous", "ping", "iface",
                     "disk", "clock", "busy", "leftovers"]
    assert {"name", "status", "detail", "fix"} <= set(doc["hosts"][0]["checks"][0])
    assert doc["ping_matrix"]["rtt_ms"][0][0] == 0.0


def test_data_paths_missing_on_a_host_fail():
    hosts = [Host(a, rank=i, python=PYTHON, data=("/data/coco",)) for i, a in enumerate(ADDRESSES[:2])]
    probes = lab_probes(2, hosts)
    probes[0] = with_facts(probes[0], data={"/data/coco": {"exists": True, "dir": True}})
    probes[1] = with_facts(probes[1], data={"/data/coco": {"exists": False, "dir": False}})
    report = report_of(probes)
    assert statuses(report, "data") == {0: PASS, 1: FAIL}


def test_version_parser_agrees_with_the_recorded_probe():
    facts = lab_facts(0)
    assert parse_torch_version(facts["python"]["torch"]["version_py"])[0] == "2.13.0+cpu"


DRIVER_DOWN = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.")


@pytest.mark.parametrize("gpus,expected", [
    ({"code": 9, "out": "", "err": DRIVER_DOWN}, "nvidia-smi failed: " + DRIVER_DOWN),
    ({"timeout": 10}, "nvidia-smi did not answer within 10s"),
])
def test_a_broken_or_hung_driver_fails_a_gpu_job(gpus, expected):
    probes = [with_facts(lab_probes(1)[0], gpus=gpus)]
    result = report_of(probes, JobOptions(gpus=(0,))).hosts[0].result("gpus")
    assert result.status == FAIL and result.detail == expected
    assert report_of(probes, JobOptions()).hosts[0].result("gpus").status == PASS
