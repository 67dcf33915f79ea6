"""A host whose workdir another host of the sync has just written (they share it) checks
it against the manifest by size and the time the writer stamped: it reads only a file
that differs, and still finds what differs."""
from __future__ import annotations

import json
import os
import zlib

from multihost.remote.sync.plan import make_plan
from multihost.sync.manifest import build_manifest


def written_tree(tmp_path, files=20):
    code, work = tmp_path / "code", tmp_path / "work"
    for directory in (code, work):
        directory.mkdir()
        for i in range(files):
            (directory / f"m{i}.py").write_text(f"VALUE = {i}\n" * 40)
    manifest = build_manifest(str(code))
    for entry in manifest.entries:   # as the writer left them: stamped with the manifest's time
        if entry.kind == "f":
            os.utime(work / entry.path, ns=(entry.mtime_ns, entry.mtime_ns))
    payload = zlib.compress(json.dumps({"entries": manifest.wires()}).encode())
    return work, manifest, payload


def plan(work, payload, **request):
    return make_plan(dict({"root": str(work), "keys": True}, **request), payload)


def test_a_written_tree_is_checked_without_reading_a_file(tmp_path):
    work, _, payload = written_tree(tmp_path)
    found = plan(work, payload, written=True)
    assert found["hashed_files"] == 0
    assert not (found["add"] or found["change"] or found["meta"] or found["retype"])
    # the same tree, not known as written: every file is read
    assert plan(tmp_path / "work", payload)["hashed_files"] == 20


def test_only_a_file_whose_time_differs_is_read_and_a_changed_one_is_found(tmp_path):
    work, manifest, payload = written_tree(tmp_path)
    names = [e.path for e in manifest.entries]
    (work / "m3.py").write_text(f"VALUE = {9}\n" * 40)     # same size, new content and time
    found = plan(work, payload, written=True)
    assert found["hashed_files"] == 1
    assert [names[i] for i in found["change"]] == ["m3.py"]


def test_a_time_kept_to_the_whole_second_is_the_writers(tmp_path):
    work, manifest, payload = written_tree(tmp_path)
    for entry in manifest.entries:   # sshfs keeps whole seconds
        cut = entry.mtime_ns - entry.mtime_ns % 1_000_000_000
        os.utime(work / entry.path, ns=(cut, cut))
    found = plan(work, payload, written=True)
    assert found["hashed_files"] == 0 and not found["meta"] and not found["change"]


def test_verify_reads_every_file_even_of_a_written_tree(tmp_path):
    work, _, payload = written_tree(tmp_path)
    assert plan(work, payload, written=True, verify=True)["hashed_files"] == 20


def test_a_sync_with_nothing_to_write_asks_no_host_what_it_shares(env, monkeypatch):
    import multihost.sync.pipeline as pipeline

    env.sync()
    asked = []
    real = pipeline.find_sharing
    monkeypatch.setattr(pipeline, "find_sharing", lambda *a, **k: asked.append(1) or real(*a, **k))
    report = env.sync()                       # every host as recorded, the code unchanged
    assert report.ok and [h.files for h in report.hosts] == [0, 0] and not asked
    (env.code / "train.py").write_text("print('train', 2)\n")
    report = env.sync()                       # a change: who shares what is asked first
    assert report.ok and [h.files for h in report.hosts] == [1, 1] and asked == [1]
    assert not os.path.exists(os.path.join(env.workdirs[0], ".multihost-share"))
