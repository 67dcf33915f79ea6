"""The sync engine end to end on this machine: two "hosts" that are local transports
(127.0.0.1 and localhost) with their own workdirs, so the real helper runs in real
subprocesses (the ``env`` fixture, in conftest.py). The lab tests do the same over SSH."""
import json
import marshal
import os
import stat
import sys
import zlib

import pytest

from multihost.errors import ConnectError, SyncError
from multihost.hosts import Host
from multihost.remote.sync.fs import host_cache, tree_key
from multihost.sync.transfer import stream_to
from multihost.transport import LocalTransport


def tree(root):
    """{path: content, or '-> target' for links, '/' for dirs} plus modes of files."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "-> " + os.readlink(full)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "/"
            else:
                with open(full, "rb") as handle:
                    out[rel] = (handle.read(), oct(st.st_mode & 0o777), st.st_mtime_ns)
    return out


def test_first_sync_makes_every_workdir_identical(env):
    report = env.sync()
    assert report.ok and [h.files for h in report.hosts] == [6, 6]
    want = tree(env.code)
    assert tree(env.workdirs[0]) == want and tree(env.workdirs[1]) == want
    assert os.readlink(os.path.join(env.workdirs[0], "dataset")) == "/data/coco"


def test_changes_deletions_and_what_the_job_wrote(env):
    env.sync()
    w0 = env.workdirs[0]
    os.makedirs(os.path.join(w0, "output"))
    with open(os.path.join(w0, "output", "model.pdparams"), "w") as f:
        f.write("weights")                      # written by the job on the host
    (env.code / "pkg" / "model.py").write_text("LAYERS = 8\n")
    os.remove(env.code / "train.py")
    (env.code / "pkg" / "new.py").write_text("x = 1\n")
    report = env.sync()
    assert report.ok
    assert (report.hosts[0].counts, report.hosts[0].deleted) == ((1, 1, 1), 1)
    assert open(os.path.join(w0, "pkg", "model.py")).read() == "LAYERS = 8\n"
    assert not os.path.exists(os.path.join(w0, "train.py"))
    assert open(os.path.join(w0, "output", "model.pdparams")).read() == "weights"


def test_an_ignored_file_on_the_host_is_left_alone(env):
    (env.code / "notes.txt").write_text("synced once\n")
    env.sync()
    (env.code / ".multihostignore").write_text("notes.txt\n")
    os.remove(env.code / "notes.txt")
    env.sync()
    assert os.path.exists(os.path.join(env.workdirs[0], "notes.txt"))


def test_an_unchanged_tree_is_neither_sent_nor_rehashed(env):
    from multihost import helper
    from multihost.sync.manifest import build_manifest
    from multihost.transport import LocalTransport

    env.sync()
    report = env.sync()
    assert [h.files for h in report.hosts] == [0, 0]
    reply = helper.call(LocalTransport(env.hosts[0]), "sync.plan", {"root": env.workdirs[0]},
                        input=build_manifest(str(env.code)).encode())
    assert (reply["hashed_files"], reply["add"], reply["change"]) == (0, [], [])


def test_a_hand_edit_with_the_old_size_and_mtime_is_found(env):
    env.sync()
    target = os.path.join(env.workdirs[1], "pkg", "model.py")
    before = os.stat(target)
    with open(target, "w") as f:
        f.write("LAYERS = 9\n")                 # same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    report = env.sync()                         # the ctime in the cache key gives it away
    assert report.hosts[1].counts[1] == 1
    assert open(target).read() == "LAYERS = 4\n"


def test_verify_repairs_what_a_lying_cache_hides(env):
    env.sync()
    root = env.workdirs[1]
    target = os.path.join(root, "pkg", "model.py")
    with open(target, "w") as f:
        f.write("LAYERS = 9\n")
    # Forge the host's cache: the new stat, the old hash (a cache can be wrong, e.g.
    # after a restore from backup with preserved times).
    path = os.path.join(host_cache("hashes"), tree_key(root) + ".cache")
    with open(path, "rb") as f:
        cache = marshal.load(f)
    st = os.stat(target)
    old = cache["e"]["pkg/model.py"][4]
    cache["e"]["pkg/model.py"] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, old)
    with open(path, "wb") as f:
        marshal.dump(cache, f)
    assert env.sync().hosts[1].files == 0      # fooled, as designed
    report = env.sync(verify=True)
    assert report.hosts[1].counts[1] == 1 and report.hosts[0].files == 0
    assert open(target).read() == "LAYERS = 4\n"


def test_dry_run_lists_and_changes_nothing(env):
    report = env.sync(dry_run=True)
    assert report.dry_run and report.hosts[0].counts == (6, 0, 0)
    assert "train.py" in report.hosts[0].added
    assert not os.path.exists(env.workdirs[0])


def test_modes_links_and_type_changes(env):
    os.chmod(env.code / "pkg", 0o750)
    env.sync()
    w0 = env.workdirs[0]
    assert stat.S_IMODE(os.stat(os.path.join(w0, "pkg")).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(os.path.join(w0, "run.sh")).st_mode) == 0o755
    # A file becomes a directory and a directory becomes a file.
    os.remove(env.code / "run.sh")
    (env.code / "run.sh").mkdir()
    (env.code / "run.sh" / "inner").write_text("x")
    os.remove(env.code / "pkg" / "__init__.py")
    os.remove(env.code / "pkg" / "model.py")
    os.rmdir(env.code / "pkg")
    (env.code / "pkg").write_text("now a file\n")
    report = env.sync()
    assert report.ok, report
    assert tree(w0) == tree(env.code)


def test_a_failing_host_is_named_and_the_others_still_sync(env):
    with open(env.workdirs[1], "w") as f:
        f.write("a file where the workdir should be")
    with pytest.raises(SyncError) as info:
        env.sync()
    err = info.value
    assert err.host == "localhost" and "not a directory" in err.cause
    assert err.report.hosts[0].ok and tree(env.workdirs[0]) == tree(env.code)


def test_size_warning_names_the_biggest_directories(env, monkeypatch):
    import multihost.sync.manifest as manifest

    monkeypatch.setattr(manifest, "WARN_FILES", 3)
    (env.code / "data").mkdir()
    for i in range(5):
        (env.code / "data" / f"{i}.bin").write_bytes(b"x" * 1000)
    report = env.sync(dry_run=True)
    assert len(report.warnings) == 1 and "data/ (5.0 KB, 5 files)" in report.warnings[0]


def test_code_revision_and_dirty_flag(env):
    import shutil
    import subprocess

    if not shutil.which("git"):
        pytest.skip("git is not installed")
    git = ["git", "-C", str(env.code), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "x"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = env.sync(dry_run=True)
    assert (report.commit, report.dirty) == (head, False)
    (env.code / "untracked.py").write_text("")
    assert env.sync(dry_run=True).dirty


def test_code_outside_any_repository_starts_no_git(tmp_path, monkeypatch):
    """Every sync asks for the code's commit; a tree no repository holds is told apart
    without a `git` process, and one inside a repository (below its top) still asks."""
    import subprocess

    from multihost.sync import manifest

    monkeypatch.delenv("GIT_DIR", raising=False)
    monkeypatch.delenv("GIT_WORK_TREE", raising=False)
    started = []
    monkeypatch.setattr(manifest.subprocess, "run",
                        lambda argv, **kw: started.append(argv) or subprocess.CompletedProcess(
                            argv, 1, "", ""))
    (tmp_path / "plain").mkdir()
    assert manifest.code_revision(str(tmp_path / "plain")) == (None, False) and started == []
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "src").mkdir()
    manifest.code_revision(str(tmp_path / "repo" / "src"))
    assert started and started[0][:3] == ["git", "-C", str(tmp_path / "repo" / "src")]


def test_an_unchanged_host_is_recognised_without_starting_its_helper(env):
    env.sync()
    events = []
    report = env.sync(listener=events.append)
    assert report.ok and [h.files for h in report.hosts] == [0, 0]
    assert not [e for e in events if type(e).__name__ == "SyncPlanned"]   # no helper ran
    # A changed key on one host (a touch) sends that host the slow way, by content.
    os.utime(os.path.join(env.workdirs[1], "train.py"))
    events.clear()
    report = env.sync(listener=events.append)
    assert [e.host for e in events if type(e).__name__ == "SyncPlanned"] == ["localhost"]
    assert report.hosts[1].meta == 1      # the mtime is put back; the content was right
    events.clear()
    env.sync(verify=True, listener=events.append)
    assert len([e for e in events if type(e).__name__ == "SyncPlanned"]) == 2


def test_stale_temporary_files_of_a_killed_receiver_are_removed(env):
    env.sync()
    stale = os.path.join(env.workdirs[0], "pkg", ".mh-tmp.999999999.model.py")
    with open(stale, "w") as f:
        f.write("half a file")
    (env.code / "pkg" / "model.py").write_text("LAYERS = 5\n")
    env.sync()
    assert not os.path.exists(stale)


class _DeadOnArrival(LocalTransport):
    """A host whose helper ends before it reads a byte of the stream."""

    def start(self, command, *, cwd=None):
        return super().start("exit 3")


def _many_records(writer):
    for number in range(4096):  # far more than a pipe holds
        writer.record({"t": "x", "p": f"{number:0>400}"})


def test_a_stream_that_breaks_while_sending_is_that_host_lost():
    with pytest.raises(ConnectError) as info:
        stream_to(_DeadOnArrival(Host(name="127.0.0.1")), {}, _many_records)
    assert (info.value.host, info.value.kind) == ("127.0.0.1", ConnectError.LOST)
    assert "broke while sending files" in str(info.value)


def test_a_bug_while_sending_is_not_disguised_as_a_lost_connection():
    def buggy(writer):
        raise KeyError("a bug of ours")

    with pytest.raises(KeyError):
        stream_to(_DeadOnArrival(Host(name="127.0.0.1")), {}, buggy)


def test_a_host_whose_workdir_is_not_there_is_planned_without_the_manifest(tmp_path, monkeypatch):
    """A first sync sends each host only the number of entries, not the manifest (every
    path and hash); a workdir that exists still gets the manifest, and is compared."""
    from multihost.sync.session import HostSession

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    transport = LocalTransport(Host(name="127.0.0.1", python=sys.executable))

    def no_manifest() -> bytes:
        raise AssertionError("the manifest was sent to a host whose workdir is not there")

    session = HostSession.start(transport, {"root": str(tmp_path / "new"), "rank": 0, "keys": True})
    plan = session.plan(3, no_manifest)
    assert plan["add"] == [0, 1, 2] and plan["exists"] is False
    session.abort()
    # made by the shared-directory probe just before the sync: still nothing of a tree
    (tmp_path / "probed" / ".multihost-share").mkdir(parents=True)
    session = HostSession.start(transport, {"root": str(tmp_path / "probed"), "rank": 0, "keys": True})
    plan = session.plan(3, no_manifest)
    assert plan["add"] == [0, 1, 2] and plan["exists"] is False
    session.abort()

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "notes.txt").write_text("mine\n")
    sent = []
    session = HostSession.start(transport, {"root": str(tmp_path / "old"), "rank": 0, "keys": True})
    manifest = zlib.compress(json.dumps({"entries": [["a.txt", "f", 1, 0o644, 1, "0" * 64]]}).encode())
    plan = session.plan(1, lambda: sent.append(1) or manifest)
    assert sent == [1] and plan["add"] == [0] and plan["exists"] is True
    session.abort()


def test_a_host_is_left_its_reusable_connection_only_once_its_files_are_there(env, monkeypatch):
    """The OpenSSH master each host is left for the next command's quick checks is a
    handshake: started beside a first sync's bytes, 64 of them take the CPU the bytes
    need; so it is started once every host has its files."""
    from multihost.fanout import HostGroup

    seen = {}
    monkeypatch.setattr(HostGroup, "leave_connection", lambda self, host: seen.setdefault(
        host.rank, os.path.exists(os.path.join(env.workdirs[host.rank], "pkg", "model.py"))))
    assert env.sync().ok
    assert seen == {0: True, 1: True}
