"""The probe that tells which hosts see one workdir, run by real shells on this machine:
the first host to link the nonce's token owns it, the others read its owner back, and
what a chatty login shell prints first is never taken for an answer."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from multihost.sync.shared import group_owners, probe_line, remove_line, tagged
from multihost.transport.base import remote_line


def probe(workdir, nonce, code="", make=True, noise="", rank=0):
    line = noise + probe_line(str(workdir), nonce, code, make, rank)
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=30).stdout
    return tagged(out, "=owner= "), tagged(out, "=code= ")


def test_hosts_that_see_one_directory_read_one_owner(tmp_path):
    shared, own = tmp_path / "shared", tmp_path / "own"
    first = probe(shared, "ab12", noise="echo Welcome to the cluster; ")
    second = probe(shared, "ab12", noise="echo Welcome to the cluster; ")
    alone = probe(own, "ab12", noise="echo Welcome to the cluster; ")
    assert first[0] != "-" and first == second and alone[0] == first[0]   # one machine here
    assert (shared / ".multihost-share" / "ab12").exists() and shared.is_dir()
    subprocess.run(["sh", "-c", remove_line(str(shared), "ab12")], check=True)
    assert not (shared / ".multihost-share").exists()


def test_one_machine_listed_twice_with_two_workdirs_shares_nothing(tmp_path):
    first, second = probe(tmp_path / "w0", "ef56", rank=0), probe(tmp_path / "w1", "ef56", rank=1)
    assert first[0] != second[0]
    assert group_owners({0: first[0], 1: second[0]}) == ()
    # both ranks in one directory read the first one's token
    assert probe(tmp_path / "w0", "ef56", rank=1) == first


def test_a_check_makes_no_workdir(tmp_path):
    assert probe(tmp_path / "missing", "cd34", make=False) == ("-", "-")
    assert not (tmp_path / "missing").exists()


def test_owners_group_only_hosts_that_read_the_same_one():
    owners = {0: "m1", 1: "m1", 2: "m3", 3: "-", 4: "m1", 5: None}
    assert group_owners(owners) == ((0, 1, 4),)


@pytest.mark.parametrize("shell", ["bash", "dash", "zsh", "tcsh", "fish"])
def test_the_probe_answers_the_same_whatever_the_login_shell(tmp_path, shell):
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} is not installed (scripts/setup.sh installs it)")
    lines = [remote_line(probe_line(str(tmp_path / "w"), "ab99", "", True, rank)) for rank in (3, 4)]
    owners = [tagged(subprocess.run([path, "-c", line], capture_output=True, text=True,
                                    timeout=30).stdout, "=owner= ") for line in lines]
    assert owners[0] != "-" and owners == [owners[0]] * 2      # the second read the first's
    assert (tmp_path / "w" / ".multihost-share" / "ab99").read_text().strip() == owners[0]
