"""``Cluster.rerun`` and ``multihost rerun`` are one path: from the same recorded job file
both hand the same request (the hosts as recorded, the spares, the setup, the timeouts,
the environment, every option) to the same ``begin``; and the job file ``Cluster.run``
keeps gives its rerun everything the run was given."""
from __future__ import annotations

import dataclasses
import time

import pytest

import multihost
from multihost import cli
from multihost.hosts import Host
from multihost.run import begin as begin_module, jobfile
from multihost.run.records import (NodeRecord, RunRecord, host_to_dict, job_file_path,
                                   new_run_id, save_job_file, save_run)


class Started(Exception):
    """Raised by the stand-in for ``begin``: the request was made, nothing started."""


class Launched:
    """What ``begin`` returns for a run that was started (detached): it records the run."""

    def __init__(self, cluster):
        self.record = record_of(tuple(cluster.hosts))

    def execute(self, listener):
        pass

    def close(self):
        pass


@pytest.fixture
def begun(monkeypatch):
    """Every (hosts, request, job) handed to ``begin``; ``begun.launch`` says whether the
    next call starts (a Launched) or stops there (Started)."""
    seen = []

    def stand_in(cluster, request, validated=None, notify=None, **_):
        seen.append((tuple(cluster.hosts), request, validated.job))
        if stand_in.launch:
            stand_in.launch = False
            return Launched(cluster)
        raise Started()

    stand_in.launch = False
    stand_in.seen = seen
    monkeypatch.setattr(begin_module, "begin", stand_in)
    return stand_in


@pytest.fixture
def project(tmp_path, monkeypatch):
    """HOME of its own, a code directory, a hostfile with a spare, an env file and a key."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('train')\n")
    (tmp_path / "hosts.ini").write_text(
        "[defaults]\nuser = root\n[10.0.0.1]\n[10.0.0.2]\n[10.0.0.4]\n"
        "[10.0.0.3]\nspare = true\npython = /opt/spare/bin/python\n")
    (tmp_path / "job.env").write_text("FROM_FILE=1\nA=env-file\n")
    (tmp_path / "key").write_text("not a real key\n")
    (tmp_path / "ssh_config").write_text("")
    return tmp_path


def record_of(hosts) -> RunRecord:
    """A recorded run on ``hosts`` (a run whose job file is then saved beside it)."""
    nodes = tuple(NodeRecord(h.rank, host_to_dict(h), h.label, h.name, 2, 2 * h.rank)
                  for h in hosts)
    record = RunRecord(run_id=new_run_id(), created=time.time(), nodes=nodes,
                       command=("train.py",), launcher="python", node0_argv="")
    save_run(record, make_last=True)
    return record


def both_reruns(run_id, begun):
    """(hosts, request, job) of `multihost rerun RUN` and of `Cluster.rerun(RUN)`."""
    with pytest.raises(Started):
        cli.main(["rerun", run_id, "--plain"])
    with pytest.raises(Started):
        multihost.Cluster.rerun(run_id)
    return begun.seen[-2], begun.seen[-1]


def same(cli_side, api_side):
    """The two paths' requests, equal but for the job's own spelling (its image fields are
    the run's, the same after validate: compared there)."""
    (hosts, request, job), (api_hosts, api_request, api_job) = cli_side, api_side
    assert hosts == api_hosts
    assert job == api_job
    assert dataclasses.replace(request, job=None) == dataclasses.replace(api_request, job=None)


def test_every_key_of_a_cli_job_file_is_reapplied_by_cluster_rerun_as_by_multihost_rerun(
        project, begun):
    table = {
        "hostfile": str(project / "hosts.ini"), "include": "10.0.0.[1-2],10.0.0.4",
        "exclude": "10.0.0.4", "spares": "root@10.0.0.5", "user": "root", "port": 2222,
        "identity": str(project / "key"), "workdir": "/srv/work", "python": "/opt/py/bin/python",
        "ssh_config": str(project / "ssh_config"), "connect_timeout": 7.0, "fanout": 8,
        "accept_new_host_keys": True, "code": str(project / "code"), "data": ["/data/a"],
        "gpus": "0,1", "nproc_per_node": 2, "start_port": 18000, "launcher": "python",
        "no_python": True, "env": {"NCCL_DEBUG": "INFO", "A": "recorded"},
        "env_file": [str(project / "job.env")], "setup": "pip install -r requirements.txt",
        "setup_always": True, "no_check": True, "no_sync": True, "allow_concurrent": True,
        "log_dir": str(project / "log"), "kill_wait": 3.0, "wait": 5.0, "gpu_interval": 1.0,
        "launch_timeout": 30.0, "name": "bert", "queue": True, "image": "img:1",
        "engine": "podman", "image_from_controller": True, "command": ["train.py", "--epochs", "3"]}
    # A key added to job files must be added here too, and reach both paths.
    assert set(table) == set(jobfile.KEYS) - {"hosts"}
    hosts = (Host("10.0.0.1", 0, user="root", port=2222, python="/opt/py/bin/python"),
             Host("10.0.0.9", 1, user="root", port=2222))   # a spare took node 1 then
    record = record_of(hosts)
    save_job_file(record.run_id, jobfile.dump(table))

    cli_side, api_side = both_reruns(record.run_id, begun)
    same(cli_side, api_side)
    used, request, _ = api_side
    assert used == hosts
    assert [h.label for h in request.spares] == ["10.0.0.3:2222", "10.0.0.5:2222"]
    assert request.spares[0].python == "/opt/py/bin/python"   # the recorded --python beats it
    assert (request.setup, request.setup_always, request.launch_timeout) == (
        "pip install -r requirements.txt", True, 30.0)
    assert dict(request.env) == {"FROM_FILE": "1", "A": "recorded", "NCCL_DEBUG": "INFO"}
    assert (request.name, request.queue, request.kill_wait, request.wait) == (
        "bert", True, 3.0, 5.0)


def test_cluster_run_keeps_its_setup_timeouts_and_spares_for_either_rerun(project, begun):
    cluster = multihost.Cluster.from_hostfile("hosts.ini")
    begun.launch = True
    run = cluster.run(["train.py", "--epochs", "3"], code="code", launcher="python",
                      check=False, sync=False, setup="echo ready", setup_always=True,
                      launch_timeout=30.0, spares="root@10.0.0.5", detach=True)
    first = begun.seen[0]
    kept = jobfile.load(str(job_file_path(run.run_id)))
    assert (kept["setup_always"], kept["launch_timeout"]) == (True, 30.0)
    assert (kept["hostfile"], kept["spares"]) == (str(project / "hosts.ini"), ["root@10.0.0.5"])

    cli_side, api_side = both_reruns(run.run_id, begun)
    same(cli_side, api_side)
    _, request, job = api_side
    asked = dataclasses.replace(first[1], job=None, detach=False, log_dir=str(project / "log"))
    assert dataclasses.replace(request, job=None) == asked   # the mirror's path kept absolute
    assert [(h.label, h.python) for h in request.spares] == [
        ("10.0.0.3", "/opt/spare/bin/python"), ("10.0.0.5", "python3")]
    assert job == dataclasses.replace(first[2], code=str(project / "code"))


def test_new_arguments_replace_the_programs_and_the_rest_is_kept(project, begun):
    cluster = multihost.Cluster.from_ips("10.0.0.1", spares="10.0.0.2", user="me")
    begun.launch = True
    run = cluster.run(["-m", "pkg.train", "--epochs", "3"], code="code", launcher="python",
                      check=False, sync=False, setup_always=True, setup="true", detach=True)
    with pytest.raises(Started):
        multihost.Cluster.rerun(run.run_id, ["--resume", "ckpt/last.pt"])
    _, request, _ = begun.seen[-1]
    assert request.command == ("-m", "pkg.train", "--resume", "ckpt/last.pt")
    assert request.setup_always and [h.label for h in request.spares] == ["10.0.0.2"]
    assert request.spares[0].user == "me"
