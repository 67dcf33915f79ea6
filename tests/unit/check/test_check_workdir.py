"""The workdir check: a workdir that is a system directory, the home directory itself or
~/.ssh is named as not ready, as the host resolves it (its own ~, `..`, symlinks), with
a --workdir that works when typed."""
import os
import shlex

import pytest

from multihost.check.fixes import actions
from multihost.check.report import FAIL
from multihost.cli import build_parser
from multihost.remote.check import ops as ops_check
from test_check_samples import lab_probes, report_of, with_facts

# What `multihost check` proposes for a job run from here (the default workdir).
DEFAULT = f"~/multihost/{os.path.basename(os.getcwd())}"


def judged(path, real, home="/root", rank=1):
    probes = lab_probes()
    disk = dict(probes[rank].facts["disk"], path=path, real=real, home=home)
    probes[rank] = with_facts(probes[rank], disk=disk)
    return report_of(probes)


@pytest.mark.parametrize("path, real, said", [
    ("/etc", "/etc", "the workdir /etc is a system directory"),
    ("/", "/", "the workdir / is a system directory"),
    ("/bin", "/usr/bin", "the workdir /bin resolves to /usr/bin, a system directory"),
    ("/root/x/../../usr/../etc/", "/etc",
     "the workdir /root/x/../../usr/../etc/ resolves to /etc, a system directory"),
    ("/root", "/root", "the workdir /root is the home directory itself"),
    ("/root/.ssh/", "/root/.ssh", "the workdir /root/.ssh is ssh's own directory"),
    ("/root/keys", "/root/.ssh", "the workdir /root/keys resolves to /root/.ssh, ssh's own"),
    # a hostfile's `workdir = ~/.ssh` holds the project's directory: never into ~/.ssh
    ("/root/.ssh/authorized_keys", "/root/.ssh/authorized_keys",
     "the workdir /root/.ssh/authorized_keys is inside ssh's own directory"),
])
def test_a_workdir_the_system_or_the_user_lives_in_is_not_ready(path, real, said):
    report = judged(path, real)
    result = report.hosts[1].result("workdir")
    assert result.status == FAIL and result.detail.startswith(said), result.detail
    assert [h.host.rank for h in report.hosts if h.result("workdir")] == [1]
    error = report.error()
    assert not report.ok and error.host == "198.18.0.12"
    assert error.fix == f"give the job a directory of its own: add `--workdir '{DEFAULT}'`"


def test_the_fix_works_when_typed():
    fix = judged("/etc", "/etc").hosts[1].result("workdir").fix
    assert actions(fix)[0][0] == "add"
    typed = shlex.split(actions(fix)[0][1])        # what the shell hands multihost
    args = build_parser("check").parse_args(["check", "--ips", "198.18.0.11", "--workdir",
                                             "/etc", *typed])
    assert args.workdir == DEFAULT                  # `~` left for the host to expand


def test_a_home_elsewhere_is_judged_by_that_hosts_own_home():
    # /root is only a home where it is the host's home: alice's host may use it.
    assert judged("/root", "/root", home="/home/alice").ok
    assert not judged("/home/alice", "/home/alice", home="/home/alice").ok


@pytest.mark.parametrize("real", ["/root/work", "/etc/myjob", "/usr/local/job", "/root/.ssh-job"])
def test_an_ordinary_workdir_adds_no_column(real):
    report = judged(real, real)
    assert report.ok and not any(h.result("workdir") for h in report.hosts)


def test_a_host_that_could_not_say_is_left_to_the_disk_check():
    probes = lab_probes()
    probes[2] = with_facts(probes[2], disk=None, timed_out=["disk"])
    report = report_of(probes)
    assert report.hosts[2].result("workdir") is None
    assert report.hosts[2].result("disk").status == FAIL


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("workdir, real", [
    ("~", "{home}"), ("~/.ssh/", "{home}/.ssh"), ("/usr/../etc/", "/etc"),
    ("link", "/etc"), ("jobs/run", "{home}/jobs/run"),
])
def test_the_host_resolves_its_own_home_dots_and_links(home, workdir, real):
    (home / "link").symlink_to("/etc")
    facts = ops_check.disk_facts({"workdir": workdir})
    assert facts["real"] == real.format(home=home) and facts["home"] == str(home)


def test_what_the_host_says_is_judged_not_ready(home):
    probes = lab_probes()
    for i, workdir in ((0, "~"), (2, "~/multihost/job"), (3, "~/.ssh")):
        probes[i] = with_facts(probes[i], disk=ops_check.disk_facts({"workdir": workdir}))
    report = report_of(probes)
    assert [h.host.rank for h in report.hosts if h.result("workdir")] == [0, 3]
    assert report.hosts[0].result("workdir").detail.startswith(
        f"the workdir {home} is the home directory itself")
    assert not report.ok
