"""A code directory left as the last walk saw it is not walked again (sync/snapshot.py),
and every change a walk would see is still seen."""
import os
import time

import pytest

import multihost.sync.manifest as manifest_module
from multihost.sync.ignore import IgnoreRules
from multihost.sync.manifest import build_manifest


@pytest.fixture
def code(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "code"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "model.py").write_text("LAYERS = 4\n")
    (root / "pkg" / "sub" / "deep.py").write_text("DEEP = 1\n")
    (root / "pkg" / ".gitignore").write_text(".gitignore\n*.log\n")   # ignores itself
    (root / "pkg" / "old.log").write_text("log\n")
    os.symlink("pkg/model.py", root / "link.py")
    (root / ".git" / "info").mkdir(parents=True)
    return root


def settled(root):
    """A walk the snapshot may trust: nothing written within the racy window."""
    time.sleep(0.1)
    return build_manifest(str(root))


def no_walk(monkeypatch):
    def refuse(*args, **kw):
        raise AssertionError("walked the tree")
    monkeypatch.setattr(manifest_module, "scan_tree", refuse)


def test_an_unchanged_tree_is_not_walked_again(code, monkeypatch):
    first = settled(code)
    no_walk(monkeypatch)
    again = build_manifest(str(code))
    assert again.entries == first.entries and again.digest == first.digest
    assert again.hashed_files == 0
    assert again.rules.ignored("pkg/new.log")      # the rules still answer


def edit_in_place_keeping_size_and_mtime(root):
    path = root / "train.py"
    st = os.stat(path)
    path.write_text("print('TRAIN')\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def retarget_link(root):
    os.remove(root / "link.py")
    os.symlink("train.py", root / "link.py")


CHANGES = {
    "file added deep down": lambda r: (r / "pkg" / "sub" / "new.py").write_text("x\n"),
    "file removed": lambda r: os.remove(r / "pkg" / "sub" / "deep.py"),
    "content, same size and mtime": edit_in_place_keeping_size_and_mtime,
    "mode": lambda r: os.chmod(r / "pkg" / "model.py", 0o755),
    "link target": retarget_link,
    "self-ignored .gitignore edited": lambda r: (r / "pkg" / ".gitignore").write_text(".gitignore\n"),
    ".git/info/exclude created": lambda r: (r / ".git" / "info" / "exclude").write_text("train.py\n"),
    "directory added": lambda r: (r / "pkg" / "data").mkdir(),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_change_a_walk_sees_is_seen(code, change):
    before = settled(code)
    CHANGES[change](code)
    after = build_manifest(str(code))
    truth = build_manifest(str(code), verify=True)   # no cache, no snapshot
    assert after.entries == truth.entries
    assert after.entries != before.entries


def test_verify_never_trusts_the_snapshot(code, monkeypatch):
    settled(code)
    no_walk(monkeypatch)
    with pytest.raises(AssertionError, match="walked the tree"):
        build_manifest(str(code), verify=True)


def test_rules_of_a_directory_no_walk_entered_still_apply(code):
    rules = IgnoreRules(str(code))     # asked about a path before any walk
    assert rules.ignored("pkg/gone.log")
    assert not rules.ignored("pkg/gone.py")
    assert rules.ignored("pkg/no-such-dir/x.log")   # a gone directory: its parent's rules


def test_an_edit_is_hashed_again_without_a_walk(code, monkeypatch):
    settled(code)
    (code / "pkg" / "model.py").write_text("LAYERS = 8\n")
    walk = manifest_module.scan_tree
    no_walk(monkeypatch)
    after = build_manifest(str(code))
    monkeypatch.setattr(manifest_module, "scan_tree", walk)
    assert after.entries == build_manifest(str(code), verify=True).entries
    assert after.hashed_files == 1


def test_an_edited_file_is_known_to_differ_from_the_tree_before_it_without_its_digest(
        code, monkeypatch):
    """A one-file sync asks each host's record whether it already has this tree: a host
    recorded at the tree before the edit is told no without the new manifest's digest
    being worked out first (it is, later, and is the digest a walk gives)."""
    before = settled(code)
    (code / "train.py").write_text("print('edited')\n")
    time.sleep(0.1)
    edited = build_manifest(str(code))
    worked_out = []
    real = manifest_module.wires_digest
    monkeypatch.setattr(manifest_module, "wires_digest",
                        lambda wires: worked_out.append(1) or real(wires))
    assert not edited.matches(before.digest)
    assert worked_out == []
    assert edited.matches(edited.digest) and edited.digest != before.digest
    monkeypatch.setattr(manifest_module, "load_snapshot", lambda *a: None)
    assert edited.digest == build_manifest(str(code)).digest   # as a full walk has it


def test_a_touched_file_with_the_same_content_is_the_same_tree(code):
    """Its key moved (a new ctime), so it is hashed again; its entry did not."""
    before = settled(code)
    path = code / "pkg" / "model.py"
    os.utime(path, ns=(os.stat(path).st_atime_ns, before.paths()["pkg/model.py"].mtime_ns))
    time.sleep(0.1)
    touched = build_manifest(str(code))
    assert touched.matches(before.digest) and touched.digest == before.digest
