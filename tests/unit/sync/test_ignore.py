"""Ignore rules: gitignore's semantics (recorded against git 2.39's check-ignore), plus
.multihostignore on top, as the code walk applies them."""
import shutil
import subprocess

import pytest

from multihost.sync.ignore import parse_line
from multihost.sync.manifest import build_manifest

GITIGNORE = r"""# comment
*.log
!keep.log
build/
/root_only.txt
docs/*.md
!docs/README.md
**/cache
a/**/z.bin
data/*
!data/README
\#hash.txt
sp\ ace
out[0-9].txt
logs/
!logs/important.txt
"""

# (path, ignored by git?) as `git check-ignore` answered for the tree below.
RECORDED = [
    ("x.log", True), ("keep.log", False), ("sub/x.log", True), ("build/a", True),
    ("sub/build/f", True), ("root_only.txt", True), ("sub/root_only.txt", False),
    ("docs/a.md", True), ("docs/README.md", False), ("docs/sub/b.md", False),
    ("cache/f", True), ("sub/cache/f", True), ("a/z.bin", True), ("a/b/c/z.bin", True),
    ("data/x", True), ("data/README", False), ("data/sub/README", True),
    ("#hash.txt", True), ("sp ace", True), ("out1.txt", True), ("outa.txt", False),
    ("logs/important.txt", True),  # a file in an excluded directory cannot come back
    ("sub/a.tmp", True), ("sub/x.tmp", False), ("a.tmp", False),
]


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "code"
    root.mkdir()
    (root / ".gitignore").write_text(GITIGNORE)
    (root / "sub").mkdir()
    (root / "sub" / ".gitignore").write_text("*.tmp\n!x.tmp\n")
    for path, _ in RECORDED:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(path)
    return root


def synced(root):
    return {e.path for e in build_manifest(str(root)).entries if e.kind == "f"}


def test_the_walk_agrees_with_recorded_git_answers(tree):
    included = synced(tree)
    wrong = [(path, ignored) for path, ignored in RECORDED if (path not in included) != ignored]
    assert wrong == []


@pytest.mark.skipif(not shutil.which("git"), reason="git is not installed")
def test_the_walk_agrees_with_the_installed_git(tree):
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    included = synced(tree)
    for path, _ in RECORDED:
        git_ignores = subprocess.run(["git", "-C", str(tree), "check-ignore", "-q", path]).returncode == 0
        assert (path not in included) == git_ignores, path
    assert ".git" not in {p.split("/")[0] for p in included}


def test_multihostignore_has_the_last_word(tree):
    (tree / ".multihostignore").write_text("!x.log\nkeep.log\n*.md\n")
    included = synced(tree)
    assert "x.log" in included             # re-included over .gitignore
    assert "keep.log" not in included      # excluded although .gitignore re-included it
    assert "docs/README.md" not in included
    assert "sub/x.log" in included         # an unanchored pattern matches at every depth


def test_a_deeper_file_beats_a_shallower_one(tree):
    (tree / "sub" / ".multihostignore").write_text("a.tmp\n!*.log\n")
    (tree / ".multihostignore").write_text("*.log\n")
    included = synced(tree)
    assert "sub/x.log" in included and "x.log" not in included


def test_git_dir_and_log_mirror_never_travel(tree):
    (tree / ".git").mkdir()
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tree / "vendor" / ".git").parent.mkdir()
    (tree / "vendor" / ".git").write_text("gitdir: ../.git/modules/vendor\n")  # a submodule
    (tree / "log" / "run1").mkdir(parents=True)
    (tree / "log" / ".multihost-mirror").write_text("")
    (tree / "log" / "run1" / "workerlog.0").write_text("loss 1.0\n")
    included = synced(tree)
    assert not any(p == ".git" or p.startswith(".git/") or p.endswith("/.git") for p in included)
    assert not any(p.startswith("log/") for p in included)


@pytest.mark.parametrize("line,path,is_dir,matches", [
    ("*.py[co]", "a/b.pyc", False, True),
    ("[!a]bc", "xbc", False, True),
    ("[!a]bc", "abc", False, False),
    ("?x", "a/x", False, False),          # ? never matches '/'
    ("foo/", "foo", False, False),        # a directory pattern does not match a file
    ("foo/", "foo", True, True),
    ("/a/b", "x/a/b", False, False),      # anchored
    ("a/b", "x/a/b", False, False),       # a middle slash anchors too
    ("**/b", "x/y/b", False, True),
    ("a/**", "a/x/y", False, True),
    ("trailing\\ ", "trailing ", False, True),
])
def test_single_patterns(line, path, is_dir, matches):
    rule = parse_line(line)
    assert rule.matches(path, is_dir) is matches


def test_blank_and_comment_lines_are_no_rules():
    assert parse_line("") is None and parse_line("   ") is None and parse_line("# x") is None
    assert parse_line("\\#x").matches("#x", False)
