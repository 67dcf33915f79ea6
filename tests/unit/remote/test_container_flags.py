"""The engine's command line of `run --image` (remote/run/container.py), built from what
a host's tools print: podman's info as recorded on a Debian 12 machine, docker's and
nvidia-smi's and nvidia-ctk's in their documented formats."""
import json
from pathlib import Path

import pytest

from multihost.remote.run import container

RECORDED = Path(__file__).parent / "recorded"
SMI_L = """GPU 0: NVIDIA H200 (UUID: GPU-0a1b2c3d-0000-1111-2222-333344445555)
GPU 1: NVIDIA H200 (UUID: GPU-1a1b2c3d-0000-1111-2222-333344445555)
  MIG 1g.18gb     Device  0: (UUID: MIG-9f0e0000-aaaa-bbbb-cccc-ddddeeeeffff)
GPU 2: NVIDIA H200 (UUID: GPU-2a1b2c3d-0000-1111-2222-333344445555)
GPU 3: NVIDIA H200 (UUID: GPU-3a1b2c3d-0000-1111-2222-333344445555)
"""
CDI_LIST = """INFO[0000] Found 9 CDI devices
nvidia.com/gpu=0
nvidia.com/gpu=1
nvidia.com/gpu=2
nvidia.com/gpu=3
nvidia.com/gpu=GPU-0a1b2c3d-0000-1111-2222-333344445555
nvidia.com/gpu=GPU-1a1b2c3d-0000-1111-2222-333344445555
nvidia.com/gpu=GPU-2a1b2c3d-0000-1111-2222-333344445555
nvidia.com/gpu=GPU-3a1b2c3d-0000-1111-2222-333344445555
nvidia.com/gpu=all
"""
DOCKER_INFO = json.dumps({"ServerVersion": "24.0.7", "SecurityOptions": [
    "name=seccomp,profile=builtin", "name=rootless", "name=cgroupns"]})
JOB = {"image": "nvcr.io/nvidia/pytorch:24.05-py3", "run_id": "20260101-120000-ab12",
       "node_rank": 1, "attempt": 0, "cwd": "/home/ann/proj", "run_dir":
       "/home/ann/.multihost/runs/20260101-120000-ab12", "visible": None}


def podman_facts(**more):
    facts = container.parse_engine_info(
        "podman", (RECORDED / "podman_info.json").read_text())
    facts.update(path="/usr/bin/podman", uid=1000, gid=1000, user="ann",
                 hard_limits={"memlock": -1, "nofile": 20000, "nproc": 96362},
                 infiniband=False, gpus=container.parse_nvidia_smi_list(SMI_L),
                 cdi=container.parse_cdi_list(CDI_LIST))
    facts.update(more)
    return facts


def pairs(words, flag):
    return [words[i + 1] for i, word in enumerate(words) if word == flag]


def test_recorded_podman_info_reads_as_rootful_4_3():
    facts = podman_facts()
    assert (facts["engine"], facts["version"], facts["rootless"]) == ("podman", "4.3.1", False)


def test_docker_info_says_rootless_from_its_security_options():
    facts = container.parse_engine_info("docker", DOCKER_INFO)
    assert facts == {"engine": "docker", "version": "24.0.7", "rootless": True}


def test_nvidia_smi_list_gives_whole_gpus_not_mig_slices():
    gpus = container.parse_nvidia_smi_list(SMI_L)
    assert [i for i, _ in gpus] == [0, 1, 2, 3]
    assert gpus[2][1] == "GPU-2a1b2c3d-0000-1111-2222-333344445555"


def test_the_job_runs_with_the_hosts_network_ipc_and_its_own_user():
    words = container.run_argv(podman_facts(), JOB, ["python3", "train.py"], "/r/env")
    assert words[:4] == ["/usr/bin/podman", "run", "--rm", "--init"]
    assert pairs(words, "--network") == ["host"] and pairs(words, "--ipc") == ["host"]
    assert pairs(words, "--user") == ["1000:1000"]
    assert words[-3:] == [JOB["image"], "python3", "train.py"]
    assert pairs(words, "-w") == ["/home/ann/proj"]
    assert pairs(words, "--env-file") == ["/r/env"]


def test_code_and_run_directories_are_mounted_at_the_same_paths():
    words = container.run_argv(podman_facts(), JOB, ["true"], "/r/env")
    assert sorted(pairs(words, "-v")) == [
        "/home/ann/.multihost/runs/20260101-120000-ab12:"
        "/home/ann/.multihost/runs/20260101-120000-ab12", "/home/ann/proj:/home/ann/proj"]
    nested = dict(JOB, run_dir="/home/ann/proj/.runs/x")
    assert pairs(container.run_argv(podman_facts(), nested, ["true"], "/r/env"), "-v") == [
        "/home/ann/proj:/home/ann/proj"]


def test_labels_and_name_say_the_run_node_and_owner():
    words = container.run_argv(podman_facts(), dict(JOB, attempt=2, local_rank=3), ["t"], "/e")
    assert pairs(words, "--name") == ["mh-20260101-120000-ab12-a2-n1-r3"]
    assert pairs(words, "--label") == ["multihost.run=20260101-120000-ab12",
                                       "multihost.node=1", "multihost.owner=ann"]


def test_ulimits_stay_within_the_hosts_hard_limits():
    words = container.run_argv(podman_facts(), JOB, ["t"], "/e")
    assert pairs(words, "--ulimit") == ["memlock=-1:-1", "nofile=20000:20000",
                                        "nproc=32768:32768"]
    tight = podman_facts(hard_limits={"memlock": 8192, "nofile": 4096, "nproc": 1000})
    assert pairs(container.run_argv(tight, JOB, ["t"], "/e"), "--ulimit") == [
        "memlock=8192:8192", "nofile=4096:4096", "nproc=1000:1000"]


def test_podman_gets_the_jobs_gpus_by_cdi_and_the_same_devices_inside():
    job = dict(JOB, visible="2,0")
    words = container.run_argv(podman_facts(), job, ["t"], "/e")
    assert pairs(words, "--device") == [
        "nvidia.com/gpu=GPU-2a1b2c3d-0000-1111-2222-333344445555",
        "nvidia.com/gpu=GPU-0a1b2c3d-0000-1111-2222-333344445555"]
    # cuda:0 inside is the host's GPU 2, as without an image
    assert "CUDA_VISIBLE_DEVICES=GPU-2a1b2c3d-0000-1111-2222-333344445555," \
           "GPU-0a1b2c3d-0000-1111-2222-333344445555" in pairs(words, "--env")


def test_docker_gets_gpus_as_one_quoted_device_list():
    facts = dict(podman_facts(), **container.parse_engine_info("docker", DOCKER_INFO))
    facts["path"] = "/usr/bin/docker"
    words = container.run_argv(facts, dict(JOB, visible="1,3"), ["t"], "/e")
    assert pairs(words, "--gpus") == ['"device=1,3"']
    assert "--pull" not in words and "--userns" not in words


def test_all_gpus_when_the_job_names_none_and_none_without_gpus():
    words = container.run_argv(podman_facts(), JOB, ["t"], "/e")
    assert len(pairs(words, "--device")) == 4
    words = container.run_argv(podman_facts(gpus=[], cdi=[]), JOB, ["t"], "/e")
    assert "--device" not in words and not any(w.startswith("CUDA_VISIBLE") for w in words)


def test_podman_without_a_cdi_spec_says_how_to_make_one():
    with pytest.raises(container.ContainerError) as err:
        container.run_argv(podman_facts(cdi=[]), JOB, ["t"], "/e")
    assert err.value.fix == "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"


def test_a_gpu_the_host_does_not_have_is_named():
    with pytest.raises(container.ContainerError, match="GPU 7 .* not one of this host's"):
        container.run_argv(podman_facts(), dict(JOB, visible="0,7"), ["t"], "/e")


def test_infiniband_brings_its_devices_and_ipc_lock():
    words = container.run_argv(podman_facts(infiniband=True, gpus=[]), JOB, ["t"], "/e")
    assert pairs(words, "--device") == ["/dev/infiniband"]
    assert pairs(words, "--cap-add") == ["IPC_LOCK"]
    assert "--cap-add" not in container.run_argv(podman_facts(gpus=[]), JOB, ["t"], "/e")


def test_rootless_podman_keeps_the_users_id_inside():
    words = container.run_argv(podman_facts(rootless=True), JOB, ["t"], "/e")
    assert pairs(words, "--userns") == ["keep-id"]


def test_env_values_go_to_the_file_and_a_multiline_one_by_name():
    text, by_name = container.env_file_lines({"B": "2", "A": "x y", "CERT": "l1\nl2"})
    assert text == "A=x y\nB=2\n" and by_name == ["CERT"]
    words = container.run_argv(podman_facts(gpus=[]), JOB, ["t"], "/e", by_name)
    assert pairs(words, "--env") == ["CERT"]
    assert not any("l1" in w for w in words)


class Engine:
    """A recorded engine: its containers by label; every command it was given."""

    def __init__(self, containers):
        self.containers = containers   # id -> labels
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv[1:])
        if argv[1] == "ps":
            wanted = argv[argv.index("--filter") + 1].split("=", 1)[1]
            key, _, value = wanted.partition("=")
            return "".join(cid + "\n" for cid, labels in self.containers.items()
                           if labels.get(key) == value)
        if argv[1] == "rm":
            for cid in argv[3:]:
                self.containers.pop(cid, None)
        return ""


def test_teardown_kills_and_removes_only_the_runs_containers():
    engine = Engine({"aaa": {"multihost.run": "R1"}, "bbb": {"multihost.run": "R1"},
                     "ccc": {"multihost.run": "R2"}, "ddd": {}})
    assert container.remove_run_containers("/usr/bin/podman", "R1", engine) == ["aaa", "bbb"]
    assert ["kill", "aaa", "bbb"] in engine.calls and ["rm", "-f", "aaa", "bbb"] in engine.calls
    assert sorted(engine.containers) == ["ccc", "ddd"]
    engine.calls.clear()
    assert container.remove_run_containers("/usr/bin/podman", "R1", engine) == []
    assert [c[0] for c in engine.calls] == ["ps"]   # nothing left: nothing killed


def test_leftovers_name_their_run_and_owner_for_both_engines():
    podman = "abc\tmh-R1-n0\tUp 5 minutes\tmap[multihost.node:0 multihost.owner:ann " \
             "multihost.run:R1]\n"
    docker = "def\tmh-R2-n1\tExited (137)\tmultihost.node=1,multihost.owner=bob," \
             "multihost.run=R2\n"
    for text, run, owner in ((podman, "R1", "ann"), (docker, "R2", "bob")):
        found = container.leftovers("/x", lambda argv, text=text: text)
        assert [(f["run"], f["owner"]) for f in found] == [(run, owner)]


def test_bad_image_flags_are_refused_before_any_host_is_asked():
    from multihost.errors import ConfigError
    from multihost.job import JobOptions
    from multihost.run.request import RunRequest, check_image

    for fields, said in (({"engine": "podman"}, "--engine chooses the engine of --image"),
                         ({"image": "x", "engine": "lxc"}, "is not podman or docker"),
                         ({"image": "-rm"}, "is not an image name"),
                         ({"image_from_controller": True}, "sends the --image")):
        with pytest.raises(ConfigError, match=said):
            check_image(RunRequest(command=("t.py",), job=JobOptions(), **fields))


def test_the_engine_is_asked_its_info_once_for_a_runs_check_image_step_and_launch(
        tmp_path, monkeypatch):
    """`podman info` costs seconds on a busy host: the check, the image step and the
    launch share one answer; a new engine binary, or an old answer, asks again."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    engine = tmp_path / "podman"
    engine.write_text("#!/bin/sh\n")
    asked = []

    def output(argv, timeout=30):
        asked.append(argv)
        return (RECORDED / "podman_info.json").read_text()

    monkeypatch.setattr(container, "_output", output)
    first = container.remembered_engine_info("podman", str(engine), now=1000.0)
    again = container.remembered_engine_info("podman", str(engine), now=1000.0 + 30)
    assert len(asked) == 1 and again == first and first["version"].startswith("4.3")
    container.remembered_engine_info("podman", str(engine),
                                     now=1000.0 + container.INFO_FRESH + 1)
    assert len(asked) == 2
    engine.write_text("#!/bin/sh\n# upgraded\n")
    container.remembered_engine_info("podman", str(engine), now=1000.0 + container.INFO_FRESH + 2)
    assert len(asked) == 3
