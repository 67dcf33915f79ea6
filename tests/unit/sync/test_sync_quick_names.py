"""The recorded names a host keeps in its cache (sync_quick's ``probe_script``): its next
check is sent none and starts no `dd`, and a copy that is missing, altered or cannot be
written only ever costs time."""
import hashlib
import os
import subprocess

from multihost.hosts import Host
from multihost.sync import quick as sync_quick
from multihost.sync.fastpath import load_record, names_digest
from multihost.transport import LocalTransport

LABELS = ["127.0.0.1", "localhost"]


def helper_streams(monkeypatch):
    import multihost.sync.transfer as streams

    calls = []
    real = streams.stream_to
    monkeypatch.setattr(streams, "stream_to", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def sent_names(monkeypatch):
    """The bytes of recorded names each probe is sent (0 for a host that keeps them)."""
    from multihost.sync.probe import Probe

    sizes = []
    real = Probe.__init__

    def init(self, process, names, *args):
        real(self, process, names, *args)
        sizes.append(len(self._names))

    monkeypatch.setattr(Probe, "__init__", init)
    return sizes


def kept_copies(env):
    folder = env.tmp / "home" / ".cache" / "multihost" / "names"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def records(env):
    return [load_record(label, env.workdirs[rank], str(env.code))
            for rank, label in enumerate(LABELS)]


def same_tree(env):
    for root in env.workdirs.values():
        for name in ("pkg/model.py", "train.py"):
            with open(env.code / name, "rb") as mine, open(os.path.join(root, name), "rb") as its:
                assert mine.read() == its.read()


def test_a_host_keeps_the_names_and_its_next_checks_are_sent_none(env, monkeypatch):
    code, sync = env.code, env.sync
    sync()
    sizes = sent_names(monkeypatch)
    streams = helper_streams(monkeypatch)
    (code / "pkg" / "model.py").write_text("LAYERS = 48\n")
    assert [h.files for h in sync().hosts] == [1, 1]    # sent, and kept
    assert len(kept_copies(env)) == 2 and all(sizes) and len(sizes) == 2
    assert all(r["held"] == names_digest(r) for r in records(env))
    (code / "pkg" / "model.py").write_text("LAYERS = 96\n")
    assert [h.files for h in sync().hosts] == [1, 1]    # a write: none sent
    assert [h.files for h in sync().hosts] == [0, 0]    # a check alone: none sent
    assert sizes[2:] == [0, 0, 0, 0] and streams == []
    same_tree(env)
    assert [h.files + h.meta for h in sync(verify=True).hosts] == [0, 0]


def test_a_missing_or_altered_copy_writes_nothing_and_the_host_is_compared(env, monkeypatch):
    """A copy gone, or one naming other paths, fails the check before anything is
    written (here a file was also edited on the host behind the sync): the host is
    compared by content, ends identical (the hand edit repaired), and is sent the names
    again, which it keeps."""
    code, sync = env.code, env.sync
    sync()
    (code / "pkg" / "model.py").write_text("LAYERS = 48\n")
    sync()
    sizes = sent_names(monkeypatch)
    for damage in ("remove", "alter"):
        for copy in kept_copies(env):
            if damage == "remove":
                copy.unlink()
            else:
                names = copy.read_bytes().split(b"\0")
                copy.write_bytes(b"\0".join(n for n in names if n != b"train.py"))
        # the host's train.py changed behind the sync: a check of the other names alone
        # would find the host as recorded, and write model.py next to a stale train.py
        for root in env.workdirs.values():
            with open(os.path.join(root, "train.py"), "a") as handle:
                handle.write("# edited on the host\n")
        (code / "pkg" / "model.py").write_text(f"LAYERS = {damage}\n")
        report = sync()
        assert report.ok and [h.files for h in report.hosts] == [2, 2]   # train.py too
        same_tree(env)
        (code / "pkg" / "model.py").write_text(f"LAYERS = {damage} again\n")
        before = len(sizes)
        assert [h.files for h in sync().hosts] == [1, 1]
        assert all(sizes[before:])                      # the names went again, and are kept
        assert len(kept_copies(env)) == 2
        same_tree(env)


def test_a_copy_is_checked_before_anything_runs(env):
    """The script alone: a copy with a name fewer or more, none, or the same files under
    other spellings (their `stat` answer is the recorded one: only the copy's own hash
    tells), makes the check exit before CHECKED; the copy as sent passes. A copy gone
    fails it too, without a word on stderr."""
    code, workdirs = env.code, env.workdirs
    env.sync()
    (code / "pkg" / "model.py").write_text("LAYERS = 48\n")
    env.sync()
    record = load_record(LABELS[0], workdirs[0], str(code))
    digest = names_digest(record)
    copy = next(c for c in kept_copies(env)
                if c.name == sync_quick.names_file(record["root"], digest))
    host = LocalTransport(Host(name="127.0.0.1"))
    line = sync_quick.probe_script(record["root"], 0, record["stat"], keep=False,
                                   names=digest, held=True)
    assert host.run(line, timeout=30).stdout == sync_quick.CHECKED
    whole = copy.read_bytes()
    respelled = b"\0".join(b"./" + name for name in whole.split(b"\0"))
    assert subprocess.run(["xargs", "-0", "stat", "--printf", sync_quick.STAT_FORMAT, "--"],
                          input=respelled, cwd=record["root"], capture_output=True).stdout \
        == subprocess.run(["xargs", "-0", "stat", "--printf", sync_quick.STAT_FORMAT, "--"],
                          input=whole, cwd=record["root"], capture_output=True).stdout
    for altered in (whole.rsplit(b"\0", 1)[0], whole + b"\0train.py", b"", respelled):
        copy.write_bytes(altered)
        done = host.run(line, timeout=30)
        assert done.exit_code == 3 and done.stdout == b""
    copy.unlink()
    done = host.run(line, timeout=30)
    assert done.exit_code == 3 and done.stdout == b"" and done.stderr == b""


def test_a_host_whose_cache_cannot_be_written_checks_from_the_input(env, monkeypatch):
    """No copy kept (where it would go is a file, not a folder): the check reads the
    names from the input as before, the host does not say it keeps them, and every later
    check is sent them; every edit still goes by the shell."""
    code, sync = env.code, env.sync
    cache = env.tmp / "home" / ".cache" / "multihost"
    cache.mkdir(parents=True)
    (cache / "names").write_text("not a folder\n")
    sync()
    sizes = sent_names(monkeypatch)
    streams = helper_streams(monkeypatch)
    for text in ("LAYERS = 48\n", "LAYERS = 96\n"):
        (code / "pkg" / "model.py").write_text(text)
        assert [h.files for h in sync().hosts] == [1, 1]
    assert [h.files for h in sync().hosts] == [0, 0]
    assert len(sizes) == 6 and all(sizes) and streams == []
    assert not any(r.get("held") for r in records(env))
    same_tree(env)


def test_hosts_sharing_a_home_keep_one_copy_and_never_read_a_half_one(env, tmp_path):
    """Hosts that share a home (NFS) and a workdir path keep one copy under one name:
    each writes a file of its own and renames it whole; a copy of other names for the
    same root goes, anything else in the folder stays."""
    code, workdirs = env.code, env.workdirs
    env.sync()
    record = load_record(LABELS[0], workdirs[0], str(code))
    names = record["names"]
    digest = names_digest(record)
    folder = env.tmp / "home" / ".cache" / "multihost" / "names"
    folder.mkdir(parents=True)
    stale = folder / (sync_quick.names_file(record["root"], "0" * 64))
    stale.write_bytes(b"old names")
    other = folder / sync_quick.names_file("/elsewhere", digest)
    other.write_bytes(b"another root's")
    line = sync_quick.probe_script(record["root"], len(names), record["stat"], keep=False,
                                   names=digest)
    runs = [subprocess.Popen(["/bin/sh", "-c", line], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE) for _ in range(8)]
    outs = [run.communicate(names)[0] for run in runs]
    assert outs == [sync_quick.NAMES_KEPT] * 8
    kept = folder / sync_quick.names_file(record["root"], digest)
    assert sorted(folder.iterdir()) == sorted([kept, other])
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == digest
    assert other.read_bytes() == b"another root's"
