"""The helper runs with the host's python3, and docs/design.md promises 3.6 and later:
checked with vermin over multihost/remote, so the promise stays true."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REMOTE = Path(__file__).resolve().parents[3] / "multihost" / "remote"

# Methods of built-in types newer than 3.6. vermin knows them only where it can tell the
# type of the object (a literal); `name.isascii()` on a variable slips through it.
UNTYPED_NEWER_METHODS = {"isascii": "3.7", "removeprefix": "3.9", "removesuffix": "3.9",
                         "bit_count": "3.10", "is_relative_to": "3.9"}


def vermin_argv():
    found = shutil.which("vermin") or str(Path(sys.executable).with_name("vermin"))
    if not Path(found).exists():
        pytest.fail("vermin is not installed: pip install -e '.[test]'")
    return [found]


def test_the_helper_needs_nothing_newer_than_python_3_6():
    done = subprocess.run(vermin_argv() + ["-q", "--no-config-file", "-t=3.6-", "--violations",
                                           "--no-tips", "--eval-annotations", str(REMOTE)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"helper code needs a newer python than 3.6:\n{done.stdout}{done.stderr}"


def test_the_helper_calls_no_method_of_a_builtin_type_newer_than_3_6():
    found = []
    for path in sorted(REMOTE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in UNTYPED_NEWER_METHODS:
                found.append(f"{path.name}:{node.lineno} .{node.attr} "
                             f"(python {UNTYPED_NEWER_METHODS[node.attr]})")
    assert not found, found


def test_operation_families_are_told_apart_without_str_isascii():
    from multihost.remote.main import family_of

    assert family_of("check.host") == "check" and family_of("run.launch") == "run"
    assert family_of("sync.session") == "sync" and family_of("sync_session") == ""
    assert family_of("Check.host") == "" and family_of("çheck.host") == "" and family_of("") == ""
