"""One writer per workdir on a host (remote/sync/lock.py): a second writer is refused
naming the first, or waits for it; a dead holder is taken over; a tree being written is
marked until the last part of its sync ends whole. Holders are separate processes, as
on a host (record locks never conflict within one process)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from multihost.remote.sync.lock import STALE, Busy, Claim, refuse_unfinished
from multihost.remote.sync.lock_files import MARKER, lock_path, marked

HOLD = """
import sys, time
from multihost.remote.sync.lock import Claim
claim = Claim(sys.argv[1], {"id": sys.argv[2], "kind": sys.argv[3], "what": sys.argv[4],
                            "born": time.time()}).take()
if len(sys.argv) > 5:
    claim.mark()
print("held", flush=True)
time.sleep(float(sys.argv[5]) if len(sys.argv) > 5 else 60)
"""


def hold(root, ident="sync:a", kind="sync", what="multihost sync from ctl", *more):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root), ident, kind, what, *more],
                            stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"held\n"
    return proc


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A home of the test's own: locks of trees below /tmp are kept there."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def root(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    return work


def test_a_younger_sync_is_refused_at_once_naming_the_first(root):
    first = hold(root)
    try:
        began = time.monotonic()
        with pytest.raises(Busy) as refused:
            Claim(str(root), {"id": "sync:b", "kind": "sync", "wait": 30,
                              "born": time.time()}).take()
        assert time.monotonic() - began < 5
        text = str(refused.value)
        assert "being written by" in text and "multihost sync from ctl" in text
        assert f"pid {first.pid}" in text and " since " in text
        assert os.path.exists(lock_path(str(root)))
    finally:
        first.kill()
        first.wait()


def test_helpers_of_the_same_sync_share_the_workdir(root):
    first = hold(root, "sync:a")
    try:
        Claim(str(root), {"id": "sync:a", "kind": "sync", "wait": 0}).take().give_back()
    finally:
        first.kill()
        first.wait()


def test_a_killed_holder_is_taken_over(root):
    first = hold(root)
    first.send_signal(signal.SIGKILL)
    first.wait()
    claim = Claim(str(root), {"id": "sync:b", "kind": "sync", "wait": 0}).take()
    claim.give_back()


def test_an_older_sync_waits_says_so_and_gets_it_once_the_first_ends(root):
    first = hold(root, "sync:a", "sync", "multihost sync from ctl", "1.5")
    said = []
    began = time.monotonic()
    claim = Claim(str(root), {"id": "sync:b", "kind": "sync", "wait": 30, "born": 1.0}
                  ).take(said.append)
    assert 1.0 < time.monotonic() - began < 10
    assert said and said[0].startswith("waiting for ") and "multihost sync from ctl" in said[0]
    assert claim.waited >= 1.0
    claim.give_back()
    first.wait()


def test_a_run_is_never_waited_for_and_the_fix_stops_it(root):
    run = hold(root, "run:r-123", "run", "run r-123")
    try:
        began = time.monotonic()
        with pytest.raises(Busy) as refused:
            Claim(str(root), {"id": "sync:b", "kind": "sync", "wait": 30, "born": 1.0}).take()
        assert time.monotonic() - began < 5
        assert "in use by run r-123" in str(refused.value)
        assert refused.value.fix.startswith("stop it first (`multihost stop r-123`)")
    finally:
        run.kill()
        run.wait()


def test_a_stream_planned_from_an_old_generation_is_refused(root):
    writer = Claim(str(root), {"id": "sync:a", "kind": "sync"}).take()
    writer.mark()              # its first change raises the generation to 1
    writer.finish(clean=False)
    with pytest.raises(Busy) as stale:
        Claim(str(root), {"id": "sync:b", "kind": "sync", "gen": "0"}).take()
    assert STALE in str(stale.value)
    Claim(str(root), {"id": "sync:c", "kind": "sync", "gen": "1"}).take().give_back()


def test_the_marker_goes_only_when_every_part_of_the_sync_ended_whole(root):
    claim = Claim(str(root), {"id": "sync:a", "kind": "sync", "part": [1, 2]}).take()
    claim.mark()
    assert os.path.exists(root / MARKER) and marked(str(root))
    claim.finish(clean=True)               # one of two parts
    assert marked(str(root))
    other = Claim(str(root), {"id": "sync:a", "kind": "sync", "part": [1, 2]}).take()
    other.mark()
    other.finish(clean=True)
    assert marked(str(root)) is None


def test_a_cut_part_leaves_the_tree_marked_and_a_run_refuses_it(root):
    claim = Claim(str(root), {"id": "sync:a", "kind": "sync", "part": [1, 1]}).take()
    claim.mark()
    claim.finish(clean=False)
    with pytest.raises(Busy) as refused:
        refuse_unfinished(str(root), "run `multihost sync` first")
    assert "incomplete: a sync into it did not finish" in str(refused.value)


def test_a_lock_that_cannot_be_opened_refuses_a_sync_but_not_a_run(root, monkeypatch):
    from multihost.remote.sync import lock as sync_lock

    def unwritable(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(sync_lock.os, "open", unwritable)
    with pytest.raises(Busy) as refused:
        Claim(str(root), {"id": "sync:a", "kind": "sync"}).take()
    assert "cannot take the lock" in str(refused.value) and "Permission denied" in str(refused.value)
    assert sync_lock.hold_for_run(str(root), "r-1") is None     # the run goes on, unheld


def test_a_lock_below_a_sticky_directory_lives_in_the_home_and_a_planted_link_is_not_followed(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)            # like /tmp: anyone may add a name
    work = shared / "job"
    work.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, shared / "job.multihost-lock")   # what another user would plant
    claim = Claim(str(work), {"id": "sync:a", "kind": "sync", "born": time.time()}).take()
    claim.mark()
    claim.finish(clean=True)
    assert victim.read_text() == "precious\n"
    assert lock_path(str(work)).startswith(os.path.expanduser("~/.multihost/locks/"))


def test_a_lock_in_place_of_a_link_is_refused_naming_it(root):
    path = lock_path(str(root))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink("/etc/hostname", path)
    with pytest.raises(Busy) as refused:
        Claim(str(root), {"id": "sync:a", "kind": "sync", "born": time.time()}).take()
    assert "not a lock file of yours" in str(refused.value) and path in str(refused.value)


def test_a_run_in_place_keeps_its_lock_in_the_home_not_in_the_parent(root):
    assert lock_path(str(root), in_place=True).startswith(os.path.expanduser("~/.multihost/locks/"))
    assert not lock_path("/run", in_place=True).startswith("/run")
