"""The workdir lock across hosts that share the workdir (NFS, sshfs: no record lock
holds between them): the first holder names its host, boot id and pid in an exclusively
created file; another host's live holder is waited for or refused with a fix naming it,
and one that is gone (this host: a dead pid, or another boot) is taken over."""
import json
import os
import subprocess
import sys
import time

import pytest

from multihost.remote.machine import host_name
from multihost.remote.sync import hostlock
from multihost.remote.sync.lock import Busy, Claim
from multihost.remote.sync.lock_files import lock_path


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def root(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    return work


def held_by(root, **holder):
    """The hold a process of another host (or an earlier boot) left in the shared file."""
    path = lock_path(str(root)) + hostlock.SUFFIX
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {"id": "sync:other", "kind": "sync", "what": "multihost sync from ctl2",
              "born": time.time(), "user": "alice", "since": time.time(),
              "host": host_name(), "boot": hostlock.boot_id(), "pid": os.getpid()}
    record.update(holder)
    with open(path, "w") as handle:
        json.dump(record, handle)
    return path


def sync_claim(ident="sync:me", wait=0, **more):
    return dict({"id": ident, "kind": "sync", "wait": wait, "born": time.time()}, **more)


def test_a_holder_on_another_host_is_refused_naming_that_host_with_a_fix(root):
    path = held_by(root, host="h2-1234abcd", pid=4242)
    with pytest.raises(Busy) as refused:
        Claim(str(root), sync_claim()).take()
    assert "being written by alice's multihost sync from ctl2 (pid 4242 on h2-1234abcd)" \
        in str(refused.value)
    assert refused.value.fix.endswith(f"if h2-1234abcd is down for good, remove its hold: rm {path}")
    assert os.path.exists(path)     # never taken from another host


def test_an_older_sync_waits_for_another_hosts_holder_until_it_is_gone(root):
    path = held_by(root, host="h2-1234abcd", born=time.time() + 100)
    said = []
    remover = subprocess.Popen([sys.executable, "-c",
                                "import os, sys, time; time.sleep(1.5); os.unlink(sys.argv[1])",
                                path])
    claim = Claim(str(root), sync_claim(wait=30, born=time.time() - 100)).take(said.append)
    remover.wait()
    assert said and "on h2-1234abcd" in said[0] and claim.waited >= 1.0
    assert json.load(open(path))["pid"] == os.getpid()
    claim.give_back()
    assert not os.path.exists(path)


def test_a_hold_of_this_host_whose_pid_is_dead_is_taken_over(root):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = held_by(root, pid=dead.pid)
    claim = Claim(str(root), sync_claim()).take()
    assert json.load(open(path))["id"] == "sync:me"
    claim.give_back()
    assert not os.path.exists(path)


def test_a_hold_of_this_host_from_an_earlier_boot_is_taken_over(root):
    held_by(root, boot="an-earlier-boot")    # its pid (this test's) is alive now: not its
    Claim(str(root), sync_claim()).take().give_back()


def test_a_live_hold_of_this_host_is_refused(root):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held_by(root, pid=sleeper.pid)
        with pytest.raises(Busy) as refused:
            Claim(str(root), sync_claim()).take()
        assert f"(pid {sleeper.pid}) since" in str(refused.value)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_another_host_of_the_same_sync_joins_and_leaves_its_hold(root):
    path = held_by(root, host="h2-1234abcd", id="sync:me")
    Claim(str(root), sync_claim("sync:me")).take().give_back()
    assert json.load(open(path))["host"] == "h2-1234abcd"


def test_a_link_planted_where_the_hold_goes_is_never_followed(root, tmp_path):
    decoy = tmp_path / "decoy.json"
    decoy.write_text(json.dumps({"host": "h9-00000000", "pid": 1, "kind": "sync"}))
    path = lock_path(str(root)) + hostlock.SUFFIX
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(decoy, path)
    old = time.time() - 3600
    os.utime(path, (old, old), follow_symlinks=False)
    claim = Claim(str(root), sync_claim()).take()     # not h9's: the link is no hold
    assert not os.path.islink(path) and json.load(open(path))["id"] == "sync:me"
    claim.give_back()
    assert json.loads(decoy.read_text())["host"] == "h9-00000000"
