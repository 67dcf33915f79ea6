"""The relay chain's pure parts and its rendezvous, on this machine: who a node takes
as its upstream, when it gives up, how the answers of a chain's nodes are merged."""
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from multihost.remote.sync import relay as sync_relay
from multihost.remote.sync import rendezvous as sync_rendezvous
from multihost.remote.sync.relay import RelayError, Rendezvous
from multihost.sync.relay import SKIP_AHEAD, chain_requests, feeder_spec, merge_answers


@pytest.fixture
def home(monkeypatch):
    # A short home, as real ones are: the relay's socket lives below it, and a socket's
    # path has at most 107 bytes (pytest's own temporary paths can be longer).
    path = Path(tempfile.mkdtemp(prefix="mh", dir="/tmp"))
    monkeypatch.setenv("HOME", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def connect(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return sock


def test_every_node_is_started_at_once_with_the_hosts_it_may_go_around():
    hops = [{"rank": r} for r in range(10)]
    requests = chain_requests(list(range(10)), hops, {r: f"/w{r}" for r in range(10)}, "ab" * 8)
    assert "listen" not in requests[0]["relay"]          # the head reads the controller
    assert all(r["relay"]["listen"] for r in requests[1:])
    assert [h["rank"] for h in requests[0]["relay"]["next"]] == list(range(1, 1 + SKIP_AHEAD))
    assert requests[9]["relay"]["next"] == [] and requests[3]["root"] == "/w3"



def test_a_chain_fed_from_a_host_listens_at_its_head_too_and_the_feeder_may_skip_it():
    """--sync-data's push: the first host, outside the chain, feeds its head; so every
    node listens, and the feeder may go around the head as any node may."""
    hops = [{"rank": r} for r in range(1, 7)]
    requests = chain_requests(list(range(1, 7)), hops, {r: f"/d{r}" for r in range(1, 7)},
                              "cd" * 8, fed=True, keys=False)
    assert all(r["relay"]["listen"] for r in requests)
    assert not any(r["keys"] for r in requests)
    spec = feeder_spec(hops, "cd" * 8)
    assert "listen" not in spec and spec["token"] == requests[0]["relay"]["token"]
    assert [h["rank"] for h in spec["next"]] == list(range(1, 1 + SKIP_AHEAD))


def test_a_head_the_feeder_went_around_is_named_with_the_feeders_cause():
    answers = [{"1": {"error": "no upstream: the relay went around this host"}},
               {"2": {"files": 4}}]
    fed = {"1": {"error": "host-to-host ssh to h1 failed: refused"}, "2": {"files": 99}}
    merged = merge_answers([1, 2], answers, fed)
    assert merged["1"]["error"] == "host-to-host ssh to h1 failed: refused"
    assert merged["2"] == {"files": 4}
    assert merge_answers([1], [{}], {"1": {"files": 4}})["1"]["error"] == "no answer from the relay"

def test_a_host_is_synced_only_by_its_own_answer_and_a_skipped_one_gets_the_cause():
    ranks = [0, 1, 2, 3]
    answers = [
        {"0": {"files": 3}, "1": {"error": "host-to-host ssh to h1 failed: refused"},
         "3": {"files": 99}},                               # a lie about another host
        {"1": {"error": "no upstream: the relay went around this host"}},
        {"2": {"files": 3}},
        {"3": {"error": "the stream ended early"}},
    ]
    merged = merge_answers(ranks, answers)
    assert merged["0"] == {"files": 3} and merged["2"] == {"files": 3}
    assert merged["1"]["error"] == "host-to-host ssh to h1 failed: refused"
    assert merged["3"]["error"] == "the stream ended early"
    assert merge_answers([5], [{}])["5"]["error"] == "no answer from the relay"


def hand_over(path, data):
    """What a join does: connect and hand over its stdin, here a pipe holding ``data``
    and then its end. Returns the connection (the join waits on it)."""
    sock = connect(path)
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    sync_rendezvous.hand_over(sock, read_end)
    os.close(read_end)  # the node holds its own copy now
    return sock


def test_the_upstream_is_the_connection_that_sends_and_a_silent_one_is_dropped(home):
    """Each join hands over its stdin: the one whose stdin has bytes is the upstream."""
    node = Rendezvous("0123456789abcdef")
    assert oct(os.stat(os.path.dirname(node.path)).st_mode & 0o777) == "0o700"
    idle = hand_over(node.path, b"")  # a host the chain went around: its stream just ends
    stray = connect(node.path)        # one that hands over nothing at all
    stray.close()
    real = hand_over(node.path, b"stream bytes")
    control_r, control_w = os.pipe()
    with os.fdopen(control_r, "rb", buffering=0) as control:
        stream = node.upstream(control, wait=10)
        assert stream.read(100) == b"s" and stream.read(100) == b"tream bytes"
    assert idle.recv(1) == b""                 # dropped: that join ends (and says so)
    stream.done()
    assert real.recv(1) == sync_rendezvous.DONE     # the join of the upstream may end now
    stream.close()
    os.close(control_w)
    late = connect(node.path)          # a hop that comes late is not left waiting
    late.close()
    node.close()
    assert not os.path.exists(node.path)  # nothing left on the host


def dropped(sock):
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:  # closed with what it sent unread
        return True


def test_a_connection_that_hands_over_anything_else_is_dropped_and_nothing_kept(home):
    """Bytes without a descriptor, or two descriptors at once, are not a join: the node
    drops the connection and keeps none of what came with it (the pipes' readers are
    gone: a write to them fails)."""
    node = Rendezvous("0123456789abcdef")
    plain = connect(node.path)
    plain.sendall(sync_rendezvous.HANDOFF + b"stream bytes")
    two = connect(node.path)
    pipes = [os.pipe(), os.pipe()]
    two.sendmsg([sync_rendezvous.HANDOFF], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        sync_rendezvous._FD.pack(pipes[0][0]) +
                                        sync_rendezvous._FD.pack(pipes[1][0]))])
    for read_end, _ in pipes:
        os.close(read_end)
    control_r, control_w = os.pipe()
    os.close(control_w)  # the controller says no upstream will come
    with os.fdopen(control_r, "rb", buffering=0) as control:
        with pytest.raises(RelayError, match="went around this host"):
            node.upstream(control, wait=10)
    assert dropped(plain) and dropped(two)
    for _, write_end in pipes:
        with pytest.raises(BrokenPipeError):
            os.write(write_end, b"x")
        os.close(write_end)
    node.close()


def test_a_node_nobody_reaches_gives_up_when_the_controller_ends_its_stdin(home):
    node = sync_relay.Node({"token": "0123456789abcdef", "listen": True, "next": []})
    control_r, control_w = os.pipe()
    os.close(control_w)
    with os.fdopen(control_r, "rb", buffering=0) as control:
        with pytest.raises(RelayError, match="went around this host"):
            node.stream(control)
    assert os.listdir(home / ".cache" / "multihost" / "relay") == []


def test_a_node_waits_a_bounded_time_for_its_upstream(home):
    node = Rendezvous("0123456789abcdef")
    control_r, control_w = os.pipe()
    with os.fdopen(control_r, "rb", buffering=0) as control:
        with pytest.raises(RelayError, match="within 0 s"):
            node.upstream(control, wait=0.2)
    os.close(control_w)


def test_a_rendezvous_refuses_a_bad_token_and_a_directory_others_can_enter(home):
    with pytest.raises(RelayError, match="bad relay token"):
        Rendezvous("../../etc/x")
    relay_dir = home / ".cache" / "multihost" / "relay"
    relay_dir.mkdir(parents=True)
    relay_dir.chmod(0o755)
    with pytest.raises(RelayError, match="not a private directory"):
        Rendezvous("0123456789abcdef")


def test_a_join_waits_a_bounded_time_for_its_node(home, monkeypatch, capsys):
    monkeypatch.setattr(sync_rendezvous, "JOIN_WAIT", 0.2)
    assert sync_rendezvous.join({"token": "0123456789abcdef"}) == 1
    assert "no relay node started here within" in capsys.readouterr().out


def test_a_skipped_hop_is_named_and_the_chain_goes_on_to_the_next(home, tmp_path):
    """Downstream tries each next host in order: one whose ssh fails at once is skipped
    with its cause, the next that answers ready is the next node."""
    fail = tmp_path / "fail.sh"
    fail.write_text("#!/bin/sh\necho 'ssh: connect to host h1 port 22: Connection refused' >&2\n"
                    "exit 255\n")
    ready = tmp_path / "ready.sh"
    ready.write_text("#!/bin/sh\nprintf '\\n=multihost-helper-output=\\n{\"ready\":true}\\n'\n"
                     "cat > \"$(dirname \"$0\")/got\"\necho '{\"ok\":true,\"result\":null}'\n")
    fail.chmod(0o755)
    ready.chmod(0o755)
    hops = [{"rank": 1, "name": "h1", "ssh": [str(fail)], "line": "x"},
            {"rank": 2, "name": "h2", "ssh": [str(ready)], "line": "x"}]
    down = sync_relay.Downstream(hops, "0123456789abcdef")
    down.feed(b"data")
    nodes = down.finish()
    assert nodes == {"1": {"error": "host-to-host ssh to h1 failed: ssh: connect to host h1 "
                                    "port 22: Connection refused", "relay": True}}
    assert (tmp_path / "got").read_bytes() == b"data"


def test_a_node_passes_on_what_it_gathered_before_it_waits_for_more():
    """Small records are gathered into big writes to the next host, but never held
    while the node waits: down a chain of 64 slow hops that would add up to seconds."""
    import threading

    read_end, write_end = os.pipe()
    ours, join_side = socket.socketpair()
    stream = sync_relay._PipeStream(read_end, ours)
    flushed = []
    stream.before_wait = lambda: flushed.append(True)
    os.write(write_end, b"0123456789")
    assert stream.read(4) == b"0123" and stream.read(6) == b"456789"
    assert flushed == []                       # more was there: no flush yet
    later = threading.Timer(0.2, lambda: os.write(write_end, b"more"))
    later.start()
    assert stream.read(4) == b"more"
    later.join()
    assert flushed == [True]                   # nothing there: passed on before waiting
    stream.close()
    os.close(write_end)
    join_side.close()


def run_join(home, stdin):
    """``sync.join`` as ssh starts it on a host: its own process, stdin from the hop."""
    import subprocess
    import sys

    code = ("import sys; from multihost.remote.sync import rendezvous as sync_rendezvous; "
            "sys.exit(sync_rendezvous.join({'token': '0123456789abcdef'}))")
    repo = str(Path(sync_rendezvous.__file__).resolve().parents[3])
    env = dict(os.environ, HOME=str(home), PYTHONPATH=repo)
    return subprocess.Popen([sys.executable, "-c", code], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def test_the_node_reads_the_stream_from_the_hop_itself_and_its_join_copies_nothing(home):
    """The join hands its stdin (the pipe from sshd) to the node and copies no byte: the
    stream reaches the node even while the join is stopped, and the join says the
    stream is through only once the node has read all of it."""
    import signal

    node = Rendezvous("0123456789abcdef")
    hop_r, hop_w = os.pipe()
    join = run_join(home, hop_r)
    os.close(hop_r)
    try:
        control_r, control_w = os.pipe()
        with os.fdopen(control_r, "rb", buffering=0) as control:
            assert join.stdout.readline() == sync_rendezvous.READY + b"\n"  # handed over
            os.kill(join.pid, signal.SIGSTOP)   # from now on the join runs no code
            os.write(hop_w, b"x" * 300000)
            os.close(hop_w)
            stream = node.upstream(control, wait=10)
            got = b""
            while len(got) < 300000:
                got += stream.read(1 << 20)
            assert got == b"x" * 300000 and stream.read(10) == b""
        os.kill(join.pid, signal.SIGCONT)
        stream.done()
        out, _ = join.communicate(timeout=20)
        assert join.returncode == 0 and b'"ok":true' in out
        stream.close()
        os.close(control_w)
    finally:
        if join.poll() is None:
            join.kill()  # ours, started above
            join.wait()
        node.close()


def test_a_join_whose_node_ends_before_the_stream_does_says_so(home):
    node = Rendezvous("0123456789abcdef")
    hop_r, hop_w = os.pipe()
    join = run_join(home, hop_r)
    os.close(hop_r)
    try:
        os.write(hop_w, b"a first part")
        control_r, control_w = os.pipe()
        with os.fdopen(control_r, "rb", buffering=0) as control:
            stream = node.upstream(control, wait=10)
            assert stream.read(1) == b"a"
        stream.close()                          # the node fails: no DONE
        out, _ = join.communicate(timeout=20)
        assert join.returncode == 1
        assert b"the relay node here went away (it ended before the stream did)" in out
        os.close(control_w)
    finally:
        os.close(hop_w)
        if join.poll() is None:
            join.kill()
            join.wait()
        node.close()
