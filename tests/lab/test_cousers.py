"""Another account on the same hosts (eve: a co-worker, a student, a stolen login) can plant
directories, links and files in the places everyone may write (/tmp), and nothing she
plants turns multihost against the user who runs it: a workdir or log directory of hers
is refused naming her and its mode, a link she put where a lock goes is never followed,
and the hosts' registry of runs is one she can neither own nor hide. The suite runs
where the kernel follows links in sticky directories (fs.protected_symlinks=0, as in
many containers): the fixture makes sure of that and puts the setting back."""
from __future__ import annotations

import os
import pwd
import secrets
import subprocess
from pathlib import Path

import pytest

from test_run import hostfile

CODE = "import os\nprint('ran as uid', os.getuid(), flush=True)\n"


class Eve:
    """A second unix user, in the passwd every lab host shares; she needs no login: what
    she plants, she plants from inside a host (runuser), as she would from her shell."""

    def __init__(self, lab):
        self.lab, self.name = lab, "mhe" + secrets.token_hex(3)
        subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", "-p", "*",
                        self.name], check=True)
        self.uid = pwd.getpwnam(self.name).pw_uid

    def on(self, i: int, script: str) -> None:
        """Run ``script`` (sh) as her inside host ``i``."""
        done = self.lab.host_run(i, ["runuser", "-u", self.name, "--", "sh", "-c",
                                     "umask 000; " + script])
        assert done.returncode == 0, done.stderr

    def remove(self) -> None:
        subprocess.run(["userdel", self.name], check=False)


@pytest.fixture(scope="module", autouse=True)
def links_followed_in_sticky_dirs():
    """fs.protected_symlinks=0: a link in /tmp is followed whoever made it."""
    path = Path("/proc/sys/fs/protected_symlinks")
    before = path.read_text().strip()
    path.write_text("0")
    yield
    path.write_text(before)


@pytest.fixture
def eve(lab):
    user = Eve(lab)
    try:
        yield user
    finally:
        user.remove()


@pytest.fixture
def code(tmp_path):
    directory = tmp_path / "code"
    directory.mkdir()
    (directory / "nap.py").write_text(CODE)
    return directory


def one_host(lab, tmp_path, *args: str, command: str = "run"):
    extra = ("--launcher", "python", "--plain") if command == "run" else ()
    tail = ("--", "nap.py") if command == "run" else ()
    return lab.multihost(command, "--hostfile", str(hostfile(lab, tmp_path, 1)), *extra, *args,
                         *tail, timeout=180)


def host_ls(lab, i: int, path: str) -> str:
    return lab.host_run(i, ["sh", "-c", f"ls -A {path} 2>&1"]).stdout


def test_a_workdir_another_user_owns_and_anyone_may_write_is_refused_by_sync_run_and_check(
        lab, tmp_path, code, eve):
    job = f"/tmp/job-{secrets.token_hex(3)}"
    eve.on(1, f"mkdir -m 777 {job}")
    named = f"{job} belongs to {eve.name} (mode 0777)"
    synced = one_host(lab, tmp_path, "--code", str(code), "--workdir", job, command="sync")
    assert synced.returncode != 0 and named in synced.stderr, synced.stderr
    assert host_ls(lab, 1, job) == ""          # nothing of ours was written into her directory
    ran = one_host(lab, tmp_path, "--code", str(code), "--workdir", job, "--no-sync", "--no-check")
    assert ran.returncode != 0 and named in ran.stderr, ran.stderr
    assert "ran as uid" not in ran.stdout + ran.stderr
    checked = one_host(lab, tmp_path, "--code", str(code), "--workdir", job, command="check")
    said = checked.stdout + checked.stderr
    assert checked.returncode != 0 and named in said and "not only yours" in said, said
    assert "chmod" not in said                  # never a fix that touches her directory


def test_a_workdir_that_is_a_link_another_user_planted_is_refused_naming_her(
        lab, tmp_path, code, eve):
    job, hers = f"/tmp/job-{secrets.token_hex(3)}", f"/tmp/hers-{secrets.token_hex(3)}"
    eve.on(1, f"mkdir -m 755 {hers} && ln -s {hers} {job}")
    synced = one_host(lab, tmp_path, "--code", str(code), "--workdir", job, command="sync")
    assert synced.returncode != 0, synced.stderr
    assert f"{job} is a link made by {eve.name} (to {hers})" in synced.stderr
    assert host_ls(lab, 1, hers) == ""


def test_a_log_dir_of_another_user_or_of_the_system_is_refused_before_anything_starts(
        lab, tmp_path, code, eve):
    hers = tmp_path / "shared-log"
    hers.mkdir()
    os.chown(hers, eve.uid, -1)
    hers.chmod(0o777)
    refused = one_host(lab, tmp_path, "--code", str(code), "--log_dir", str(hers))
    assert refused.returncode != 0, refused.stderr
    assert f"--log_dir {hers} is not only yours" in refused.stderr
    assert f"belongs to {eve.name} (mode 0777)" in refused.stderr
    system = one_host(lab, tmp_path, "--code", str(code), "--log_dir", "/etc")
    assert system.returncode != 0 and "--log_dir /etc is a system directory" in system.stderr
    assert "ran as uid" not in refused.stdout + system.stdout


def test_a_lock_link_planted_where_the_workdir_lock_goes_is_never_followed(
        lab, tmp_path, code, eve):
    job = f"/tmp/job-{secrets.token_hex(3)}"
    victim = f"/root/victim-{secrets.token_hex(3)}"
    lab.host_run(1, ["sh", "-c", f"echo precious > {victim}"], check=True)
    eve.on(1, f"ln -s {victim} {job}.multihost-lock")
    try:
        synced = one_host(lab, tmp_path, "--code", str(code), "--workdir", job, command="sync")
        assert synced.returncode == 0, synced.stderr
        assert lab.host_run(1, ["cat", victim]).stdout == "precious\n"
        ran = one_host(lab, tmp_path, "--code", str(code), "--workdir", job)
        assert ran.returncode == 0 and "ran as uid 0" in ran.stdout + ran.stderr, ran.stderr
        assert lab.host_run(1, ["cat", victim]).stdout == "precious\n"
    finally:
        lab.host_run(1, ["rm", "-rf", victim, job, f"{job}.multihost-lock"])


def test_a_run_in_place_leaves_no_lock_in_the_parent_directory(lab, tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "nap.py").write_text(CODE)
    done = lab.multihost("run", "--launcher", "python", "--plain", "--allow-concurrent", "--",
                         "nap.py", cwd=str(project))
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "proj.multihost-lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]
