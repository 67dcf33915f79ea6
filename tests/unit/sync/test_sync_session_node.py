"""A host's sync session as its relay node: the one message that makes it one (a relay
request in place of a sync stream), read by one codec that refuses anything else, and a
real session (the helper run by the local transport) taking its upstream through its
rendezvous as a ``sync.receive`` node does."""
import hashlib
import io
import json
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

import pytest

from multihost.errors import RemoteError
from multihost.hosts import Host
from multihost.remote.sync import rendezvous as sync_rendezvous
from multihost.remote.sync.wire import (MAGIC, MAX_NODE_REQUEST, NODE_MAGIC, StreamError,
                                        encode, encode_node_request, read_next)
from multihost.sync.session import HostSession
from multihost.transport import LocalTransport

TOKEN = "0123456789abcdef" * 2
REQUEST = {"root": "/w", "rank": 3, "keys": True,
           "relay": {"token": TOKEN, "listen": True, "next": [{"rank": 4, "ssh": ["ssh"]}]}}


def test_a_relay_request_reads_back_as_it_was_sent():
    stream = io.BytesIO(encode_node_request(REQUEST) + b"after")
    assert read_next(stream) == ("node", REQUEST)
    assert stream.read() == b"after"     # not a byte more is taken


def test_a_sync_stream_and_an_ended_input_are_told_apart_from_a_request():
    assert read_next(io.BytesIO(MAGIC + b"records")) == ("stream", MAGIC)
    assert read_next(io.BytesIO(b"")) == (None, None)


@pytest.mark.parametrize("cut", [3, len(NODE_MAGIC) + 2, len(NODE_MAGIC) + 4 + 10])
def test_a_truncated_request_is_refused(cut):
    raw = encode_node_request(REQUEST)[:cut]
    with pytest.raises(StreamError, match="ended early|neither"):
        read_next(io.BytesIO(raw))


def test_an_oversize_request_is_refused_before_its_body_is_read():
    stream = io.BytesIO(NODE_MAGIC + struct.pack(">I", MAX_NODE_REQUEST + 1) + b"{")
    with pytest.raises(StreamError, match="a relay request of"):
        read_next(stream)
    assert stream.read() == b"{"
    with pytest.raises(ValueError):
        encode_node_request(dict(REQUEST, pad="x" * MAX_NODE_REQUEST))


@pytest.mark.parametrize("body", [b"not json", b"\xff\xfe", b"[1, 2]"])
def test_a_request_that_is_not_a_json_object_is_refused(body):
    with pytest.raises(StreamError, match="unreadable|not an object"):
        read_next(io.BytesIO(NODE_MAGIC + struct.pack(">I", len(body)) + body))


@pytest.mark.parametrize("change", [
    {"root": 5}, {"rank": "3"}, {"rank": True}, {"keys": "yes"}, {"relay": []},
    {"relay": {"token": 7, "listen": True, "next": []}},
    {"relay": {"token": TOKEN, "listen": "yes", "next": []}},
    {"relay": {"token": TOKEN, "listen": True, "next": "h2"}},
])
def test_a_request_with_a_field_of_the_wrong_type_is_refused(change):
    body = json.dumps(dict(REQUEST, **change)).encode()
    with pytest.raises(StreamError, match="relay request"):
        read_next(io.BytesIO(NODE_MAGIC + struct.pack(">I", len(body)) + body))


def test_anything_else_is_refused():
    with pytest.raises(StreamError, match="neither a sync stream nor a relay request"):
        read_next(io.BytesIO(b"GET / HTTP/1.0\r\n\r\n"))


# -- a real session --------------------------------------------------------------------

@pytest.fixture
def home(monkeypatch):
    """A short HOME: a rendezvous is a unix socket under it (108 bytes at most)."""
    path = tempfile.mkdtemp(prefix="mh")
    monkeypatch.setenv("HOME", path)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def local(home):
    return LocalTransport(Host(name="127.0.0.1", python=sys.executable))


def planned_session(transport, root):
    session = HostSession.start(transport, {"root": str(root), "rank": 0, "keys": True})
    plan = session.plan(1, lambda: b"")
    assert plan["exists"] is False
    return session, plan


def answer(transport, process):
    from multihost import helper

    process.stdin.close()
    out = process.stdout.read()
    code = process.wait(30)
    err = process.read_stderr()
    process.close()
    return helper.parse_reply(transport, "sync.session", code, out, err)


def test_a_session_made_a_node_for_another_workdir_refuses_and_writes_nothing(tmp_path, home,
                                                                              local):
    session, plan = planned_session(local, tmp_path / "w")
    elsewhere = tmp_path / "elsewhere"
    process = session.become_node(dict(REQUEST, root=str(elsewhere), rank=0))
    with pytest.raises(RemoteError, match=r"a relay request for .*elsewhere \(rank 0\) reached the "
                                          r"session of .*w \(rank 0\)"):
        answer(local, process)
    assert not elsewhere.exists() and not (tmp_path / "w").exists()
    relay = home / ".cache" / "multihost" / "relay"
    assert not relay.exists() or os.listdir(relay) == []   # it never listened


def test_a_session_sent_anything_else_fails_with_one_line(tmp_path, local):
    session, _ = planned_session(local, tmp_path / "w")
    session.process.stdin.write(b"GET / HTTP/1.0\r\n\r\n")
    with pytest.raises(RemoteError, match="the controller sent neither a sync stream nor a "
                                          "relay request") as caught:
        answer(local, session.process)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "w").exists()


def test_a_session_made_a_node_takes_its_upstream_and_writes_what_it_brings(tmp_path, local):
    """The same process that planned: it listens on the rendezvous, a hop hands it its
    stdin (as `sync.join` does), and what comes that way is written and answered."""
    session, plan = planned_session(local, tmp_path / "w")
    process = session.become_node({"root": plan["root"], "rank": 0, "keys": True,
                                   "relay": {"token": TOKEN, "listen": True, "next": []}})
    path = sync_rendezvous.rendezvous_path(TOKEN)
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert os.path.exists(path), "the session never listened"
    content = b"weights" * 1000
    hop_r, hop_w = os.pipe()
    hop = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hop.connect(path)
    sync_rendezvous.hand_over(hop, hop_r)
    os.close(hop_r)
    os.write(hop_w, MAGIC + encode({"t": "begin"}) + encode(
        {"t": "f", "p": "weights.bin", "s": len(content), "m": 0o644, "mt": 10**18,
         "h": hashlib.sha256(content).hexdigest()}) + content + encode({"t": "end"}))
    os.close(hop_w)
    assert hop.recv(1) == sync_rendezvous.DONE   # the node read the whole stream
    hop.close()
    nodes = answer(local, process)["nodes"]
    assert nodes["0"]["files"] == 1 and "weights.bin" in nodes["0"]["keys"]
    assert (tmp_path / "w" / "weights.bin").read_bytes() == content
    assert os.listdir(os.path.dirname(path)) == []   # no rendezvous left


def test_a_session_made_a_node_that_nobody_reaches_gives_up_when_its_stdin_ends(tmp_path, home,
                                                                                local):
    session, plan = planned_session(local, tmp_path / "w")
    process = session.become_node({"root": plan["root"], "rank": 0, "keys": True,
                                   "relay": {"token": TOKEN, "listen": True, "next": []}})
    with pytest.raises(RemoteError, match="went around this host"):
        answer(local, process)
    assert os.listdir(home / ".cache" / "multihost" / "relay") == []
