"""The remote helper, shipped and called through the local transport (a real subprocess)."""
import dataclasses
import io
import sys
import zipfile

import pytest

from multihost import helper
from multihost.errors import RemoteError
from multihost.hosts import Host
from multihost.transport import LocalTransport


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the helper cache lands in this test's home
    return LocalTransport(Host(name="127.0.0.1", python=sys.executable))


def test_zip_is_deterministic_and_holds_only_the_remote_package():
    data, digest = helper.helper_zip(), helper.helper_id()
    helper.helper_id.cache_clear()
    assert (helper.helper_zip(), helper.helper_id()) == (data, digest)
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "__main__.py" in names and "mhremote/proto.py" in names
    assert all(n == "__main__.py" or n.startswith("mhremote/") for n in names)


def test_helper_name_changes_with_its_code(monkeypatch):
    """A host must never run an old helper under a new helper's name."""
    before = helper.helper_id()
    sources = helper._sources()
    changed = sources[:-1] + [(sources[-1][0], sources[-1][1] + b"\n# changed\n")]
    monkeypatch.setattr(helper, "_sources", lambda: changed)
    helper.helper_id.cache_clear()
    try:
        assert helper.helper_id() != before
    finally:
        helper.helper_id.cache_clear()


def test_first_call_installs_then_reuses(local, tmp_path):
    result = helper.call(local, "basic.hello")
    assert result["python"] == sys.version.split()[0]
    installed = list((tmp_path / ".cache" / "multihost").glob("helper-*"))
    assert len(installed) == 1 and (installed[0] / "mhremote" / "proto.py").is_file()
    mtime = installed[0].stat().st_mtime_ns
    helper.call(local, "basic.hello")
    assert installed[0].stat().st_mtime_ns == mtime
    # unpacked, so that python keeps the compiled modules for the next call
    assert list((installed[0] / "mhremote" / "__pycache__").glob("proto.*.pyc"))


def test_unknown_operation_is_a_remote_error_with_a_fix(local):
    with pytest.raises(RemoteError) as info:
        helper.call(local, "no-such-op")
    assert "unknown helper operation" in str(info.value) and info.value.fix


def test_missing_interpreter_names_the_flag(local):
    broken = LocalTransport(dataclasses.replace(local.host, python="/nonexistent/python3"))
    with pytest.raises(RemoteError) as info:
        helper.call(broken, "basic.hello")
    assert "/nonexistent/python3" in str(info.value) and "--python" in str(info.value)


def test_helper_modules_import_only_the_standard_library():
    """The hosts have nothing installed: the helper may only import stdlib and itself."""
    import ast
    from pathlib import Path

    allowed = set(sys.stdlib_module_names)
    for path in Path(helper.__file__).with_name("remote").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
