"""The receiving end, fed raw streams: what a hostile or cut-off sender can and cannot do.
The helper runs for real (local transport); the streams are written by hand."""
import hashlib
import io
import json
import os
import sys

import pytest

from multihost import helper
from multihost.hosts import Host
from multihost.remote.sync.wire import MAGIC, Reader, StreamError, Writer, encode
from multihost.transport import LocalTransport


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return LocalTransport(Host(name="127.0.0.1", python=sys.executable))


def receive(transport, root, raw: bytes):
    process = helper.start(transport, "sync.receive", {"root": str(root), "rank": 0})
    process.stdin.write(raw)
    process.stdin.close()
    out = process.stdout.read()
    code = process.wait(30)
    return code, json.loads(out.strip().splitlines()[-1])


def file_record(path, content: bytes, mode=0o644, mtime=1_600_000_000 * 10**9):
    return encode({"t": "f", "p": path, "s": len(content), "m": mode, "mt": mtime,
                   "h": hashlib.sha256(content).hexdigest()}) + content


def test_a_stream_round_trips_through_writer_and_reader(tmp_path):
    source = tmp_path / "a.bin"
    source.write_bytes(b"abc" * 1000)
    out = io.BytesIO()
    writer = Writer(out)
    writer.record({"t": "begin"})
    writer.file({"t": "f", "p": "a.bin", "s": 3000, "m": 0o644, "mt": 1, "h": "x"}, str(source))
    writer.end()
    reader = Reader(io.BytesIO(out.getvalue()))
    assert reader.header()["t"] == "begin"
    header = reader.header()
    assert b"".join(reader.content(header["s"])) == b"abc" * 1000
    assert reader.header() == {"t": "end"}


def test_a_file_that_shrinks_while_sent_is_padded_and_refused(tmp_path, local):
    source = tmp_path / "a.bin"
    source.write_bytes(b"short")
    out = io.BytesIO()
    writer = Writer(out)
    writer.file({"t": "f", "p": "a.bin", "s": 10, "m": 0o644, "mt": 1,
                 "h": hashlib.sha256(b"0123456789").hexdigest()}, str(source))
    writer.end()
    code, reply = receive(local, tmp_path / "w", out.getvalue())
    node = reply["result"]["nodes"]["0"]
    assert node["files"] == 0 and "changed on the sender" in node["errors"][0][1]
    assert not (tmp_path / "w" / "a.bin").exists()


def test_a_cut_stream_leaves_old_files_and_no_partial_one(tmp_path, local):
    root = tmp_path / "w"
    root.mkdir()
    (root / "big.bin").write_bytes(b"old" * 100)
    content = os.urandom(3 << 20)
    raw = MAGIC + file_record("small.txt", b"complete\n") + file_record("big.bin", content)
    code, reply = receive(local, root, raw[: len(raw) - (1 << 20)])   # cut inside big.bin
    assert code != 0 and "ended early" in reply["error"]
    assert (root / "small.txt").read_bytes() == b"complete\n"
    assert (root / "big.bin").read_bytes() == b"old" * 100
    assert sorted(os.listdir(root)) == ["big.bin", "small.txt"]      # no temporary left


@pytest.mark.parametrize("path", ["../escape.txt", "/tmp/abs.txt", "a/../../b", "./x", "a//b", ""])
def test_paths_outside_the_tree_are_refused(tmp_path, local, path):
    root = tmp_path / "w"
    code, reply = receive(local, root, MAGIC + file_record(path, b"evil") + encode({"t": "end"}))
    node = reply["result"]["nodes"]["0"]
    assert node["files"] == 0 and node["errors"]
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "b").exists()


def test_no_write_goes_through_a_symlink(tmp_path, local):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "w"
    raw = (MAGIC + encode({"t": "l", "p": "link", "to": str(outside)})
           + file_record("link/planted.txt", b"evil")
           + encode({"t": "x", "p": "link/victim"})
           + encode({"t": "d", "p": "link/dir", "m": 0o755})
           + file_record("ok.txt", b"fine") + encode({"t": "end"}))
    (outside / "victim").write_text("keep me")
    code, reply = receive(local, root, raw)
    node = reply["result"]["nodes"]["0"]
    assert os.listdir(outside) == ["victim"] and (outside / "victim").read_text() == "keep me"
    assert [p for p, _ in node["errors"]] == ["link/planted.txt", "link/victim", "link/dir"]
    assert all("symlink" in text for _, text in node["errors"])
    assert (root / "ok.txt").read_text() == "fine" and os.readlink(root / "link") == str(outside)


def test_a_corrupt_stream_is_refused_before_anything_is_written(tmp_path, local):
    code, reply = receive(local, tmp_path / "w", b"GET / HTTP/1.0\r\n\r\n")
    assert code != 0 and "not a multihost sync stream" in reply["error"]


def test_reader_rejects_an_absurd_header_length():
    with pytest.raises(StreamError):
        Reader(io.BytesIO(MAGIC + b"\xff\xff\xff\xff")).header()


def test_the_host_side_parses_as_python_3_6():
    """Hosts may run an old python3: the sync and data modules use 3.6 syntax only."""
    import ast
    from pathlib import Path

    import multihost.remote as remote

    names = ["sync/fs", "sync/wire", "sync/apply", "sync/plan", "sync/relay",
             "sync/host", "data/host", "sync/ops", "data/ops"]
    for name in names:
        source = (Path(remote.__file__).parent / f"{name}.py").read_text()
        ast.parse(source, filename=name, feature_version=(3, 6))


def test_a_list_of_100000_owned_paths_reaches_the_host(tmp_path, local):
    """The paths a sync owns once went in the stream's first header, which a receiver
    refuses above 1 MB: a first sync of some 25,000 files or more failed on every host."""
    from multihost.remote.sync.plan import read_tracked
    from multihost.sync.deliver import direct_fill
    from multihost.sync.model import HostNeeds

    owned = tuple(sorted(f"package_{i % 100}/module_with_a_long_name_{i}.py"
                         for i in range(100_000)))
    needs = HostNeeds(rank=0, root=str(tmp_path / "w"), send=(), relayable=(), dirs=(),
                      meta=(), deletes=(), added=owned, changed=(), tracked=owned)
    out = io.BytesIO()
    writer = Writer(out)
    direct_fill(needs, str(tmp_path), (), lambda n: None, lambda: None)(writer)
    writer.end()
    code, reply = receive(local, tmp_path / "w", out.getvalue())
    assert code == 0 and reply["ok"], reply
    assert read_tracked(str(tmp_path / "w")) == list(owned)


def test_a_corrupt_list_of_owned_paths_is_refused(tmp_path, local):
    raw = MAGIC + encode({"t": "tracked", "s": 5}) + b"12345" + encode({"t": "end"})
    code, reply = receive(local, tmp_path / "w", raw)
    assert code == 1 and "tracked paths" in reply["error"]
