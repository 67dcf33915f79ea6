"""The shell-written small change (sync_quick), on this machine's own /bin/sh: what a
host holds after it, and that a cut stream or a failing host never leaves a half file."""
import os
import shlex

import pytest

from multihost.sync import quick as sync_quick
from multihost.errors import SyncError
from multihost.hosts import Host
from multihost.sync import fastpath as fastpath
from multihost.sync.fastpath import load_record
from multihost.sync.manifest import build_manifest
from multihost.transport import LocalTransport


def helper_streams(monkeypatch):
    """Count the helper streams a sync starts (the quick path starts none)."""
    import multihost.sync.transfer as streams  # where the engine takes stream_to from, when used

    calls = []
    real = streams.stream_to
    monkeypatch.setattr(streams, "stream_to", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def same_file(a, b):
    sa, sb = os.stat(a), os.stat(b)
    with open(a, "rb") as fa, open(b, "rb") as fb:
        assert fa.read() == fb.read()
    assert (sa.st_mode & 0o7777, sa.st_mtime_ns) == (sb.st_mode & 0o7777, sb.st_mtime_ns)


def test_an_edit_is_written_by_the_shell_with_content_mode_and_mtime(env, monkeypatch):
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    (code / "pkg" / "model.py").write_text("LAYERS = 12\n# a longer file than before\n")
    (code / "run.sh").write_text("#!/bin/sh\necho run\n")
    streams = helper_streams(monkeypatch)
    report = sync()
    assert streams == [] and [h.files for h in report.hosts] == [2, 2]
    for root in workdirs.values():
        same_file(code / "pkg" / "model.py", os.path.join(root, "pkg", "model.py"))
        same_file(code / "run.sh", os.path.join(root, "run.sh"))
        assert not [n for n in os.listdir(os.path.join(root, "pkg")) if n.startswith(".mh-tmp.")]
    # what it recorded is right: the next sync finds every host as it is by one hash
    # of each host's `stat` answer, and a comparison by content agrees
    for rank, root in workdirs.items():
        assert load_record(["127.0.0.1", "localhost"][rank], root, str(code))["stat"]
    parsed = []
    real = fastpath.parse_stat_output
    monkeypatch.setattr(fastpath, "parse_stat_output", lambda *a: parsed.append(1) or real(*a))
    assert [h.files for h in sync().hosts] == [0, 0] and parsed == []
    assert [h.files + h.meta for h in sync(verify=True).hosts] == [0, 0]


def test_a_full_sync_records_the_hash_too(env):
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    for rank, root in workdirs.items():
        assert load_record(["127.0.0.1", "localhost"][rank], root, str(code))["stat"]


def test_new_files_and_deletions_go_the_helper_way(env, monkeypatch):
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    (code / "pkg" / "new.py").write_text("x = 1\n")
    os.remove(code / "train.py")
    streams = helper_streams(monkeypatch)
    sync()
    assert len(streams) == 2
    for root in workdirs.values():
        assert os.path.exists(os.path.join(root, "pkg", "new.py"))
        assert not os.path.exists(os.path.join(root, "train.py"))


def test_a_cut_stream_leaves_the_old_file_and_no_temporary(env, tmp_path):
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    target = os.path.join(workdirs[0], "pkg", "model.py")
    before = open(target).read()
    (code / "pkg" / "model.py").write_text("LAYERS = 400000\n")
    entry = next(e for e in build_manifest(str(code)).entries if e.path == "pkg/model.py")
    host = LocalTransport(Host(name="127.0.0.1"))
    line = sync_quick.script(workdirs[0], [entry])
    done = host.run(line, input=b"LAYERS", timeout=30)     # 6 of 16 bytes, then EOF
    assert not done.ok
    assert open(target).read() == before
    assert not [n for n in os.listdir(os.path.dirname(target)) if n.startswith(".mh-tmp.")]


def test_a_host_that_cannot_do_it_gets_the_change_from_the_helper(env, monkeypatch):
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    (code / "train.py").write_text("print('changed')\n")
    monkeypatch.setattr(sync_quick, "_FUNCTIONS",
                        sync_quick._FUNCTIONS.replace("put() {\n", "put() {\n  return 1\n"))
    streams = helper_streams(monkeypatch)
    report = sync()
    assert report.ok and len(streams) == 2
    for root in workdirs.values():
        same_file(code / "train.py", os.path.join(root, "train.py"))


def test_quick_send_refuses_by_raising_and_never_half_reports(env):
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    (code / "train.py").write_text("print('changed')\n")

    class Broken(LocalTransport):
        def _argv(self, line):
            return ["/bin/sh", "-c", "exit 1"]

    from multihost.sync.fastpath import load_record, plan_from_record
    from multihost.sync.model import needs_from_plan

    manifest = build_manifest(str(code))
    record = load_record("127.0.0.1", workdirs[0], str(code))
    needs = needs_from_plan(manifest, 0, plan_from_record(record, manifest))
    with pytest.raises(SyncError):
        sync_quick.quick_send(Broken(Host(name="127.0.0.1")), needs, record, str(code))
    nodes = sync_quick.quick_send(LocalTransport(Host(name="127.0.0.1")), needs, record, str(code))
    assert nodes["0"]["files"] == 1 and set(nodes["0"]["keys"]) == {"train.py"}


def test_a_plan_from_the_snapshot_is_the_plan_from_the_record(env, monkeypatch):
    """A host recorded at the tree the snapshot holds, some of its files edited since:
    its plan comes from the edited entries alone, and is what comparing every recorded
    entry gives."""
    import time

    from multihost.sync import manifest as manifest_module
    from multihost.sync.fastpath import load_record, plan_from_record

    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    time.sleep(0.1)
    build_manifest(str(code))   # a snapshot of the tree the hosts have, past the racy window
    (code / "train.py").write_text("print('changed')\n")
    os.chmod(code / "run.sh", 0o700)
    os.utime(code / "pkg" / "model.py")          # touched: the same content, a new mtime
    time.sleep(0.1)
    manifest = build_manifest(str(code))
    record = load_record("127.0.0.1", workdirs[0], str(code))
    assert manifest.edits_since(record["digest"]) is not None
    quick = plan_from_record(record, manifest)
    monkeypatch.setattr(manifest_module.Manifest, "edits_since", lambda self, digest: None)
    assert quick == plan_from_record(record, manifest)
    assert len(quick["change"]) == 1 and len(quick["meta"]) == 2


def commands_run(monkeypatch):
    """Every command a sync runs on a host, by host (each one an `ssh` client on a real
    host: the round trips a sync costs)."""
    calls = []
    real_run, real_start = LocalTransport.run, LocalTransport.start
    monkeypatch.setattr(LocalTransport, "run", lambda self, line, **k: calls.append(
        self.host.name) or real_run(self, line, **k))
    monkeypatch.setattr(LocalTransport, "start", lambda self, line, **k: calls.append(
        self.host.name) or real_start(self, line, **k))
    return calls


def test_a_one_file_change_costs_each_host_one_command(env, monkeypatch):
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    (code / "pkg" / "model.py").write_text("LAYERS = 48\n")
    calls = commands_run(monkeypatch)
    report = sync()
    assert [h.files for h in report.hosts] == [1, 1]
    assert sorted(calls) == ["127.0.0.1", "localhost"]
    for root in workdirs.values():
        same_file(code / "pkg" / "model.py", os.path.join(root, "pkg", "model.py"))
    # what that one command recorded lets the next sync find both hosts with one hash
    calls.clear()
    assert [h.files for h in sync().hosts] == [0, 0] and len(calls) == 2
    assert [h.files + h.meta for h in sync(verify=True).hosts] == [0, 0]


def test_a_host_edited_behind_the_sync_gets_nothing_from_the_shell_and_is_compared(env, monkeypatch):
    """The one-command write checks the host's whole tree first: a host that is not as
    the last sync left it is compared by content, and ends identical."""
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    stray = os.path.join(workdirs[1], "train.py")
    with open(stray, "w") as handle:
        handle.write("print('edited on the host')\n")
    (code / "pkg" / "model.py").write_text("LAYERS = 48\n")
    streams = helper_streams(monkeypatch)
    report = sync()
    assert report.ok and streams == []
    assert [h.files for h in report.hosts] == [1, 2]
    for root in workdirs.values():
        same_file(code / "pkg" / "model.py", os.path.join(root, "pkg", "model.py"))
        same_file(code / "train.py", os.path.join(root, "train.py"))


def synced_then_edited(env, text: str):
    """Sync, then give pkg/model.py ``text``: (its path on host 0, what it holds there,
    its manifest entry, host 0's record)."""
    code, workdirs = env.code, env.workdirs
    env.sync()
    target = os.path.join(workdirs[0], "pkg", "model.py")
    before = open(target).read()
    (code / "pkg" / "model.py").write_text(text)
    entry = next(e for e in build_manifest(str(code)).entries if e.path == "pkg/model.py")
    return target, before, entry, load_record("127.0.0.1", workdirs[0], str(code))


def test_a_failed_check_writes_nothing_and_says_nothing(env):
    code, workdirs = env.code, env.workdirs
    target, before, entry, record = synced_then_edited(env, "LAYERS = 48\n")
    names = record["names"]
    writes = sync_quick.probe_writes([entry], ["pkg", "pkg/model.py"]) + \
        sync_quick.read_files(str(code), [entry])
    host = LocalTransport(Host(name="127.0.0.1"))
    line = sync_quick.probe_script(workdirs[0], len(names), "0" * 64)
    done = host.run(line, input=names + writes, timeout=30)
    assert done.exit_code == 3 and not done.stdout.startswith(sync_quick.CHECKED)
    assert open(target).read() == before
    line = sync_quick.probe_script(workdirs[0], len(names), record["stat"])
    done = host.run(line, input=names + writes, timeout=30)
    assert done.ok and done.stdout.startswith(sync_quick.CHECKED)
    assert open(target).read() == "LAYERS = 48\n"


@pytest.mark.parametrize("left", ["a killed probe's file", "a directory"])
def test_a_name_a_killed_probe_left_for_this_pid_fails_no_check(env, tmp_path, monkeypatch,
                                                                 left):
    """A probe killed outright (SIGKILL runs no trap) leaves its answer file, named by
    its pid; pids wrap, and the shell that gets that pid next must still check and
    write. Its own file is replaced; a name it cannot take (another user's file, a
    directory) gets one from `mktemp`. Nothing of this shell's is left."""
    code, workdirs = env.code, env.workdirs
    target, before, entry, record = synced_then_edited(env, "LAYERS = 48\n")
    names = record["names"]
    writes = sync_quick.probe_writes([entry], ["pkg", "pkg/model.py"]) + \
        sync_quick.read_files(str(code), [entry])
    line = sync_quick.probe_script(workdirs[0], len(names), record["stat"])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    plant = 'mkdir -- "$TMPDIR/mh-probe.$$"' if left == "a directory" else \
        'echo stale > "$TMPDIR/mh-probe.$$"'
    # `exec`: the probe's shell has the pid the name was left for
    done = LocalTransport(Host(name="127.0.0.1")).run(
        f"{plant} && exec /bin/sh -c {shlex.quote(line)}", input=names + writes, timeout=30)
    assert done.ok and done.stdout.startswith(sync_quick.CHECKED), done.stderr
    assert open(target).read() == "LAYERS = 48\n"
    assert [p.is_dir() for p in scratch.iterdir()] == ([True] if left == "a directory" else [])


def test_the_answer_after_a_write_is_the_one_a_full_stat_gives():
    fields = lambda *keys: b"".join(b"\0".join(k) + b"\0" for k in keys)
    a, b, c = [b"81a4", b"1", b"2.000000000", b"2.000000000", b"7"], \
        [b"41ed", b"4096", b"1.000000000", b"1.000000000", b"8"], \
        [b"81a4", b"3", b"3.000000000", b"3.000000000", b"9"]
    b2, c2 = b[:2] + [b"5.000000000", b"5.000000000", b"8"], [b"81a4", b"4"] + c[2:]
    assert sync_quick.splice(fields(a, b, c, b2, c2), 3, [1, 2]) == (
        fields(a, b, c), fields(b2, c2), fields(a, b2, c2), fields(b, c))
    # a host that answers for more or fewer paths, or cuts its answer, is not believed
    assert sync_quick.splice(fields(a, b, c, b2), 3, [1, 2]) is None
    assert sync_quick.splice(fields(a, b, c, b2, c2, c2), 3, [1, 2]) is None
    assert sync_quick.splice(fields(a, b, c, b2, c2)[:-1], 3, [1, 2]) is None


def test_a_check_keeps_its_answer_without_mktemp_and_never_through_a_link(env, monkeypatch,
                                                                           tmp_path):
    """The host's check starts one process fewer (no `mktemp`: its shell creates its own
    file exclusively); a name already taken, a link among them, is never written
    through: that host is compared by content instead, and still ends identical."""
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    shims, called = tmp_path / "bin", tmp_path / "called"
    shims.mkdir()
    (shims / "mktemp").write_text(f"#!/bin/sh\necho mktemp >> {called}\nexit 1\n")
    (shims / "mktemp").chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", str(tmp))
    (code / "pkg" / "model.py").write_text("LAYERS = 48\n")
    streams = helper_streams(monkeypatch)
    assert [h.files for h in sync().hosts] == [1, 1] and streams == []
    assert not called.exists() and os.listdir(tmp) == []   # its file is gone too
    # Every name a probe's shell could pick is taken: a link to a file outside. (A
    # host whose record is its answer keeps none: recorded by the helper's way again.)
    sync(verify=True)
    assert "keys" in load_record("127.0.0.1", workdirs[0], str(code))
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    real_start = LocalTransport.start
    monkeypatch.setattr(LocalTransport, "start", lambda self, line, **k: real_start(
        self, line.replace("mh-probe.$$", "mh-probe.taken"), **k))
    os.symlink(victim, tmp / "mh-probe.taken")
    (code / "pkg" / "model.py").write_text("LAYERS = 96\n")
    report = sync()
    assert report.ok and [h.files for h in report.hosts] == [1, 1]
    assert victim.read_text() == "mine\n"
    for root in workdirs.values():
        same_file(code / "pkg" / "model.py", os.path.join(root, "pkg", "model.py"))


def shimmed(monkeypatch, tmp_path, *commands):
    """Every call of ``commands`` by a host's shell, logged (each then runs the real one)."""
    shims, log = tmp_path / "shims", tmp_path / "calls"
    shims.mkdir()
    for name in commands:
        real = next(os.path.join(d, name) for d in os.environ["PATH"].split(os.pathsep)
                    if os.access(os.path.join(d, name), os.X_OK))
        (shims / name).write_text(f'#!/bin/sh\necho {name} >> {log}\nexec {real} "$@"\n')
        (shims / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    return lambda: log.read_text().split() if log.exists() else []


def test_an_edit_costs_a_host_no_chmod_no_size_stat_and_no_dd_for_the_script(env, monkeypatch,
                                                                             tmp_path):
    """At 64 hosts on shared cores every process a host starts is wall time: a file whose
    mode a umask gives is created with it, its size is known whole by what follows it on
    the stream, and the shell reads the writes itself. Per host: one `dd` of the file;
    the check's `stat` and the written paths' one; and, the first time only, the `dd`
    of the names (the host keeps them: later checks are sent none) and the `cat` and
    `rm` of the check's answer (then the record holds it)."""
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    (code / "pkg" / "model.py").write_text("LAYERS = 48\n")
    calls = shimmed(monkeypatch, tmp_path, "chmod", "stat", "dd", "cat", "rm")
    assert [h.files for h in sync().hosts] == [1, 1]
    assert sorted(calls()) == ["cat"] * 2 + ["dd"] * 4 + ["rm"] * 2 + ["stat"] * 4
    (code / "pkg" / "model.py").write_text("LAYERS = 96\n")
    before = len(calls())
    assert [h.files for h in sync().hosts] == [1, 1]
    assert sorted(calls()[before:]) == ["dd"] * 2 + ["stat"] * 4
    for root in workdirs.values():
        same_file(code / "pkg" / "model.py", os.path.join(root, "pkg", "model.py"))
    before = len(calls())
    assert [h.files for h in sync().hosts] == [0, 0]     # nothing to do: a check alone
    assert sorted(calls()[before:]) == ["stat"] * 2
    for root in workdirs.values():
        same_file(code / "pkg" / "model.py", os.path.join(root, "pkg", "model.py"))
    # an executable file needs its `chmod`: a umask cannot give execute bits
    (code / "run.sh").write_text("#!/bin/sh\necho 2\n")
    assert [h.files for h in sync().hosts] == [1, 1]
    assert calls().count("chmod") == 2
    for root in workdirs.values():
        same_file(code / "run.sh", os.path.join(root, "run.sh"))


def test_a_probe_cut_short_in_a_file_never_renames_it_into_place(env):
    """The file's contents, then the empty line after them, are what says it is whole:
    a stream that ends inside the contents, or right after them, lands nothing."""
    code, workdirs = env.code, env.workdirs
    target, before, entry, record = synced_then_edited(env, "LAYERS = 400000\n")
    writes = sync_quick.probe_writes([entry], ["pkg", "pkg/model.py"])
    host = LocalTransport(Host(name="127.0.0.1"))
    whole = sync_quick.read_files(str(code), [entry])
    for cut in (b"LAYERS", whole[:-1], whole):
        # the temporary file moved the directory's times: the check's hash, learned again
        record["stat"] = None
        assert fastpath.host_unchanged(host, record)
        line = sync_quick.probe_script(workdirs[0], len(record["names"]), record["stat"])
        if cut == whole:
            break
        done = host.run(line, input=record["names"] + writes + cut, timeout=30)
        assert done.stdout.startswith(sync_quick.CHECKED) and not done.ok
        assert open(target).read() == before
        assert not [n for n in os.listdir(os.path.dirname(target)) if n.startswith(".mh-tmp.")]
    done = host.run(line, input=record["names"] + writes + whole, timeout=30)
    assert done.ok and open(target).read() == "LAYERS = 400000\n"


def test_a_mode_the_umask_did_not_give_goes_the_helper_way(env, monkeypatch):
    """A default ACL on a host's directory overrides the umask: the host's answer shows
    the mode it got, and a file with another mode than sent is rewritten by the helper."""
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    monkeypatch.setattr(sync_quick, "_FUNCTIONS",
                        sync_quick._FUNCTIONS.replace('umask "$2"', "umask 077"))
    (code / "pkg" / "model.py").write_text("LAYERS = 48\n")
    streams = helper_streams(monkeypatch)
    report = sync()
    assert report.ok and len(streams) == 2
    for root in workdirs.values():
        same_file(code / "pkg" / "model.py", os.path.join(root, "pkg", "model.py"))


def test_a_host_written_by_its_shell_is_recorded_before_the_last_host_answers(env, monkeypatch):
    """At 64 hosts, saving every record after the last answer was a serial tail: each
    host's record is saved as soon as its own answer is in. Here the second host answers
    only once the first one's record is there (or after 20 s: then the test fails)."""
    import time
    from multihost.sync.probe import Probe

    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    first = fastpath.record_path("127.0.0.1", workdirs[0], str(code))
    before = os.stat(first).st_mtime_ns
    (code / "pkg" / "model.py").write_text("LAYERS = 48\n")
    seen = []
    real_write = Probe.write

    def write(self, label, needs, record, files, data, timeout):
        if label == "localhost":
            for _ in range(200):
                if os.stat(first).st_mtime_ns != before:
                    seen.append(True)
                    break
                time.sleep(0.1)
        return real_write(self, label, needs, record, files, data, timeout)

    monkeypatch.setattr(Probe, "write", write)
    report = sync()
    assert report.ok and [h.files for h in report.hosts] == [1, 1] and seen == [True]
    assert [h.files for h in sync().hosts] == [0, 0]
    assert [h.files + h.meta for h in sync(verify=True).hosts] == [0, 0]


def test_a_quick_write_records_the_hosts_answer_and_a_later_sync_reads_its_keys(env, monkeypatch):
    """After a write by the shell, a host's record is its `stat` answer as the host gave
    it (nothing unpacked or packed per host); a later sync that needs the keys (a new
    file goes the helper's way) parses them from it, and records a host as it is."""
    code, workdirs, sync = env.code, env.workdirs, env.sync
    sync()
    (code / "pkg" / "model.py").write_text("LAYERS = 48\n")
    assert [h.files for h in sync().hosts] == [1, 1]
    records = [load_record(label, workdirs[rank], str(code))
               for rank, label in enumerate(["127.0.0.1", "localhost"])]
    assert all("answer" in r and "keys" not in r for r in records)
    (code / "pkg" / "new.py").write_text("x = 1\n")
    (code / "train.py").write_text("print('changed')\n")
    streams = helper_streams(monkeypatch)
    assert [h.files for h in sync().hosts] == [2, 2] and len(streams) == 2
    for root in workdirs.values():
        same_file(code / "pkg" / "new.py", os.path.join(root, "pkg", "new.py"))
    for rank, label in enumerate(["127.0.0.1", "localhost"]):  # recorded, with every key
        assert "keys" in load_record(label, workdirs[rank], str(code))
    parsed = []
    real = fastpath.parse_stat_output
    monkeypatch.setattr(fastpath, "parse_stat_output", lambda *a: parsed.append(1) or real(*a))
    assert [h.files for h in sync().hosts] == [0, 0] and parsed == []
    assert [h.files + h.meta for h in sync(verify=True).hosts] == [0, 0]


def test_names_any_shell_would_trip_on_are_checked_as_they_are(env, monkeypatch):
    """Quotes, spaces, a newline, a leading dash, `$(...)`, backquotes and bytes that are
    not UTF-8 in the code's paths: the host's shell checks and writes exactly those
    files (the names reach `stat` NUL-separated, the written one quoted), and runs none
    of them as shell."""
    code, workdirs, sync = env.code, env.workdirs, env.sync
    odd = ["it's here.py", "two  spaces.py", "new\nline.py", "-starts-with-dash.py",
           "$(touch pwned).py", "`id`.py", '"quoted".py']
    for name in odd:
        (code / "pkg" / name).write_text("x = 0\n")
    os.mkdir(os.fsencode(code / "pkg") + b"/\xff\xfe-latin")
    with open(os.fsencode(code / "pkg") + b"/\xff\xfe-latin/a.py", "w") as handle:
        handle.write("x = 0\n")
    sync()
    (code / "pkg" / "it's here.py").write_text("x = 1  # edited\n")
    streams = helper_streams(monkeypatch)
    assert [h.files for h in sync().hosts] == [1, 1] and streams == []   # the quick path
    for root in workdirs.values():
        for name in odd:
            same_file(code / "pkg" / name, os.path.join(root, "pkg", name))
        assert not os.path.exists(os.path.join(root, "pwned"))
    # and each host's answer was for those very names: the next sync finds them as recorded
    assert [h.files for h in sync().hosts] == [0, 0] and streams == []
