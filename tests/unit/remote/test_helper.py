"""The remote helper, shipped and called through the local transport (a real subprocess)."""
import dataclasses
import io
import json
import socket
import sys
import tarfile

import pytest

from multihost import helper, helper_output
from multihost.errors import CommandTimeout, RemoteError
from multihost.hosts import Host
from multihost.transport import LocalTransport


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the helper cache lands in this test's home
    return LocalTransport(Host(name="127.0.0.1", python=sys.executable))


def archive_names(data: bytes) -> list:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return archive.getnames()


def test_archive_is_deterministic_and_holds_only_the_remote_package():
    data, digest = helper.helper_archive(), helper.helper_id()
    helper.helper_id.cache_clear()
    assert (helper.helper_archive(), helper.helper_id()) == (data, digest)
    names = archive_names(data)
    assert "__main__.py" in names and "mhremote/proto.py" in names
    assert all(n == "__main__.py" or n.startswith("mhremote/") for n in names)


def test_archive_is_compressed_as_one_stream():
    """Every host's first contact uploads it: stored file by file (a zip whose entries
    were not compressed) it cost 193 KB, compressed file by file 73 KB."""
    sources = sum(len(data) for _, data in helper._sources())
    assert len(helper.helper_archive()) < sources / 3


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


class ChattyShell(LocalTransport):
    """A host whose login shell prints before running our command (`echo` in .bashrc),
    once without a final newline, once with a line that looks like a reply."""

    noise = "echo Welcome to the cluster; echo '{\"ok\": true, \"result\": \"forged\"}'; printf 'no newline'; "

    def _argv(self, line):
        return ["/bin/sh", "-c", self.noise + line]


@pytest.fixture
def chatty(local):
    return ChattyShell(local.host)


def test_a_chatty_login_shell_is_never_taken_for_the_helpers_reply(chatty):
    assert helper.call(chatty, "basic.hello")["python"] == sys.version.split()[0]
    process = helper.start(chatty, "basic.hello")   # a stream's first line is the helper's
    try:
        first = json.loads(process.stdout.readline())
        assert first["ok"] and first["result"]["pid"] > 0
        assert process.stdout.read() == b"" and process.wait(30) == 0
    finally:
        process.close()


def test_a_shell_that_prints_without_end_is_cut_off_with_one_line(chatty, monkeypatch):
    monkeypatch.setattr(helper_output, "MAX_NOISE", 4096)
    chatty.noise = "yes welcome | head -c 100000; "
    process = helper.launch(chatty, "basic.hello")
    with pytest.raises(RemoteError) as info:
        process.stdout.readline()
    process.close()
    assert "printed over" in str(info.value) and "127.0.0.1" in str(info.value)
    assert ".bashrc" in info.value.fix


def test_a_fix_reaches_the_host_as_we_did_port_included(local):
    remote = LocalTransport(Host(name="gpu3", user="ai", port=2222))
    assert helper.login_hint(remote) == "ssh -p 2222 ai@gpu3"
    assert helper.login_hint(LocalTransport(Host(name="gpu3"))) == "ssh gpu3"


def test_a_shell_that_never_starts_the_helper_ends_in_a_timeout_naming_the_host():
    class Silent:
        """An ssh stream whose host never sends a byte (a .bashrc waiting on stdin)."""
        read_timeout = None
        timeouts = []

        class stdout:
            @staticmethod
            def readline(size=-1):
                raise socket.timeout("timed out")

        def set_timeout(self, seconds):
            self.timeouts.append(seconds)

    process = Silent()
    output = helper.HelperOutput(process, "gpu3:2222", "ssh -p 2222 ai@gpu3")
    with pytest.raises(CommandTimeout) as info:
        output.readline()
    assert str(info.value).startswith("gpu3:2222: the helper did not start within 60s")
    assert "`ssh -p 2222 ai@gpu3 true`" in info.value.fix
    assert process.timeouts == [60.0, None]   # its own (MULTIHOST_HELPER_START), then none again


def test_every_operation_is_named_family_verb_and_lives_in_its_family_module():
    """One naming style: ``run.launch`` is in run/ops.py, so a call loads only that module."""
    import re

    from multihost.remote import main as remote_main, proto

    remote_main.load_ops()
    assert proto.OPS, "no operation registered"
    for name, (function, _stream) in proto.OPS.items():
        assert re.fullmatch(r"[a-z]+\.[a-z_]+", name), name
        module = remote_main.FAMILIES[remote_main.family_of(name)]
        assert function.__module__ == f"multihost.remote.{module}", name


def test_a_python_the_account_may_not_execute_is_named_with_a_fix_that_shows_why():
    remote = LocalTransport(Host(name="gpu3", user="alice", python="/opt/team/venv/bin/python"))
    stderr = b"sh: 1: exec: /opt/team/venv/bin/python: Permission denied\n"
    refused = helper.python_refused(remote, stderr)
    assert "/opt/team/venv/bin/python: Permission denied: alice may not execute it" in str(refused)
    assert refused.fix.startswith("`ssh alice@gpu3 namei -l /opt/team/venv/bin/python` shows")
    assert "--python /usr/bin/python3" in refused.fix
    with pytest.raises(RemoteError) as info:   # a helper call says the same
        helper.parse_reply(remote, "check.host", 126, b"", stderr)
    assert "Permission denied: alice may not execute it" in str(info.value)
    assert helper.python_refused(remote, b"cp: x: Permission denied\n") is None
