"""The Slurm lab's config text: the lines a namespace needs, and the hosts as the lab
names and addresses them."""
from __future__ import annotations

from multihost.lab import config, slurm

HW = {"CPUs": 4, "SocketsPerBoard": 1, "CoresPerSocket": 4, "ThreadsPerCore": 1}


def settings(text: str) -> dict:
    lines = [l for l in text.splitlines() if l and not l.startswith("#")]
    return {l.split("=", 1)[0]: l.split("=", 1)[1] for l in lines}


def test_slurm_conf_names_every_host_at_its_lab_address():
    conf = settings(slurm.slurm_conf(3, HW))
    assert conf["SlurmctldHost"] == "ctl(198.18.0.1)"
    node = conf["NodeName"]
    assert node.startswith("h1,h2,h3 NodeAddr=198.18.0.11,198.18.0.12,198.18.0.13 CPUs=4 ")
    assert "Sockets=1 CoresPerSocket=4 ThreadsPerCore=1" in node


def test_slurm_conf_works_without_cgroups_and_keeps_state_inside_the_hosts():
    conf = settings(slurm.slurm_conf(2, HW))
    assert conf["ProctrackType"] == "proctrack/linuxproc"
    assert "CgroupPlugin=cgroup/v1" in slurm.cgroup_conf()
    # Every path a daemon writes is under the host's private /run, or its log dir.
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldLogFile", "SlurmdLogFile"):
        assert conf[key].startswith(config.HOST_RUN_DIR + "/")
    assert int(conf["SlurmdTimeout"]) <= 10 and conf["ReturnToService"] == "2"


def test_the_lab_binds_its_own_slurm_and_munge_dirs(tmp_path):
    paths = config.LabPaths(tmp_path)
    assert slurm.binds(paths) == [[str(tmp_path / "slurm" / "etc"), "/etc/slurm"],
                                  [str(tmp_path / "slurm" / "munge"), "/etc/munge"]]
