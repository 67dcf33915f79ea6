"""The logs.tail wire format: what the host writes is what the controller reads, through
one codec that both sides use."""
import ast
import io
from pathlib import Path

import pytest

import multihost.remote as remote
from multihost.remote.logs import frames


def read_all(raw: bytes):
    stream, found = io.BytesIO(raw), []
    while True:
        frame = frames.read_frame(stream)
        if frame is None:
            return found
        found.append(frame)


def test_every_frame_the_host_writes_reads_back_the_same():
    lines = b"".join(b"step %d loss 0.5\n" % i for i in range(2000))   # packs well
    raw = (frames.data_frame("log/workerlog.1", 0, b"hello\n")
           + frames.data_frame("log/workerlog.1", 6, lines, compress=True)
           + frames.state_frame({"state": "running"})
           + frames.heartbeat_frame(12.5)
           + frames.end_frame({"state": "failed", "exit_code": 3}))
    assert b"\nZ log/workerlog.1 6 " in raw, "the big block went compressed"
    got = read_all(raw)
    assert [(f.kind, f.name, f.offset, f.data) for f in got[:2]] == [
        ("D", "log/workerlog.1", 0, b"hello\n"), ("D", "log/workerlog.1", 6, lines)]
    assert frames.state_of(got[2]) == {"state": "running"}
    assert (got[3].kind, got[3].body) == ("H", "12.500")
    assert got[4].kind == "E" and frames.state_of(got[4]) == {"state": "failed", "exit_code": 3}


def test_a_node_without_a_record_survives_and_a_name_with_spaces_is_refused():
    got = read_all(frames.data_frame("log/serverlog.0", 3, b"x\n") + frames.end_frame(None))
    assert (got[0].name, got[0].offset) == ("log/serverlog.0", 3)
    assert frames.state_of(got[1]) is None
    with pytest.raises(frames.BadFrame):   # names never hold spaces: a header to refuse
        read_all(frames.data_frame("log/my log", 3, b"x\n"))


def test_a_packed_frame_that_does_not_unpack_to_its_length_is_refused():
    raw = frames.data_frame("launcher.log", 0, b"a\n" * 4096, compress=True)
    header, _, payload = raw.partition(b"\n")
    kind, name, offset, length, packed = header.split(b" ")
    lying = b" ".join((kind, name, offset, b"9", packed)) + b"\n" + payload
    with pytest.raises(frames.BadFrame):
        read_all(lying)


def test_a_stream_cut_inside_a_frame_is_an_error_not_a_short_read():
    with pytest.raises(EOFError):
        read_all(frames.data_frame("launcher.log", 0, b"0123456789\n")[:-4])


def test_the_host_side_of_runs_and_logs_parses_as_python_3_6():
    for name in ("logs/frames", "run/states", "logs/ops"):
        source = (Path(remote.__file__).parent / f"{name}.py").read_text()
        ast.parse(source, filename=name, feature_version=(3, 6))
