"""A relay hop's shell join (no Python start) and its node side, on this machine: the
join is bash running the hop's line, the node a Rendezvous in this process."""
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from multihost.remote import sync_shelljoin
from multihost.remote.sync_relay import Rendezvous
from multihost.remote.sync_shelljoin import PidLines, open_stdin

TOKEN = "0123456789abcdef"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PYTHON_JOIN = ("exec %s -c 'import sys, json; from multihost.remote import sync_rendezvous as r; "
               "sys.exit(r.join(json.loads(sys.argv[1])))'" % shlex.quote(sys.executable))

needs_bash = pytest.mark.skipif(not shutil.which("bash") or not os.path.isdir("/proc/self/fd"),
                                reason="the shell join is bash's, on Linux")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(sync_shelljoin.PYTHON_JOIN_ENV, raising=False)
    return tmp_path


def relay_dir(home):
    return home / ".cache" / "multihost" / "relay"


def start_join(home, stdin):
    """The hop's line as sshd starts it: the login shell, stdin the pipe from sshd."""
    line = sync_shelljoin.join_line("printf '\\n%s\\n' =marker=; ", PYTHON_JOIN)
    line += " " + shlex.quote(json.dumps({"token": TOKEN}))
    env = dict(os.environ, HOME=str(home), PYTHONPATH=REPO)
    return subprocess.Popen(["bash", "-c", line], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def wait_ready(join):
    lines = [join.stdout.readline() for _ in range(3)]
    assert lines == [b"\n", b"=marker=\n", b'{"ready":true}\n'], lines


def take_stream(node, size):
    control_r, control_w = os.pipe()
    try:
        with os.fdopen(control_r, "rb", buffering=0) as control:
            stream = node.upstream(control, wait=20)
            got = b""
            while len(got) < size:
                data = stream.read(1 << 20)
                assert data, "the stream ended early"
                got += data
            assert stream.read(10) == b""
            return stream, got
    finally:
        os.close(control_w)


def feed(write_end, data):
    def run():
        os.write(write_end, data)
        os.close(write_end)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def finish(join):
    try:
        return join.communicate(timeout=20)[0]
    finally:
        if join.poll() is None:
            join.kill()  # ours, started above
            join.wait()


def deliver(home, data, during=lambda join: None, before=lambda node: None):
    """``data`` through a shell join to a node in this process, as a hop sends it: what
    the join printed after its ready line, once the node has read it all and said so.
    ``before(node)`` is called before the join starts; ``during(join)`` as the stream
    starts and once it is all read."""
    node = Rendezvous(TOKEN)
    before(node)
    hop_r, hop_w = os.pipe()
    join = start_join(home, hop_r)
    os.close(hop_r)
    try:
        wait_ready(join)
        during(join)
        writer = feed(hop_w, data)
        stream, got = take_stream(node, len(data))
        writer.join()
        assert got == data
        during(join)
        stream.done()
        out = finish(join)
        assert join.returncode == 0, out
        stream.close()
        return out
    finally:
        node.close()
        finish(join)


def is_bash(join):
    assert os.path.basename(os.readlink("/proc/%d/exe" % join.pid)).startswith("bash")


@needs_bash
def test_a_shell_join_gives_the_node_its_stdin_and_runs_no_python(home):
    """The node reads the hop's pipe itself; the join is the shell alone while the
    stream flows; it ends ok once the node has read everything; nothing is left."""
    out = deliver(home, b"y" * 300000, during=is_bash)
    assert out.endswith(b'{"ok":true,"result":null}\n')
    assert os.listdir(relay_dir(home)) == []


@needs_bash
def test_a_node_that_cannot_open_the_joins_stdin_sends_it_to_pythons_join(home, monkeypatch):
    """Where /proc/PID/fd/0 cannot be used (here: the test hook), the node answers P and
    the shell runs Python's join, which hands its stdin over the socket: delivered."""
    monkeypatch.setenv(sync_shelljoin.PYTHON_JOIN_ENV, "1")
    out = deliver(home, b"z" * 200000)
    assert out == b'{"ready":true}\n{"ok":true,"result":null}\n'
    assert os.listdir(relay_dir(home)) == []


@needs_bash
def test_a_shell_join_whose_node_ends_before_the_stream_does_says_so(home):
    node = Rendezvous(TOKEN)
    hop_r, hop_w = os.pipe()
    join = start_join(home, hop_r)
    os.close(hop_r)
    try:
        wait_ready(join)
        os.write(hop_w, b"a first part")
        control_r, control_w = os.pipe()
        with os.fdopen(control_r, "rb", buffering=0) as control:
            stream = node.upstream(control, wait=20)
            assert stream.read(1) == b"a"
        stream.close()                      # the node fails: no D
        out = finish(join)
        assert join.returncode == 1
        assert b"the relay node here went away (it ended before the stream did)" in out
        os.close(control_w)
    finally:
        os.close(hop_w)
        node.close()
        finish(join)
    assert os.listdir(relay_dir(home)) == []


@needs_bash
def test_a_shell_join_whose_node_is_dead_ends_at_once_and_leaves_nothing(home):
    """A node killed with its FIFO left behind: the join does not wait on it."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    relay_dir(home).mkdir(parents=True, mode=0o700)
    stale = relay_dir(home) / ("%s.%d.join" % (TOKEN, dead.pid))
    os.mkfifo(str(stale), 0o600)
    hop_r, hop_w = os.pipe()
    join = start_join(home, hop_r)
    os.close(hop_r)
    try:
        out = finish(join)
    finally:
        os.close(hop_w)
    assert join.returncode == 1 and b"the relay node here is gone" in out
    assert os.listdir(relay_dir(home)) == [stale.name]   # its own FIFO removed


@needs_bash
def test_garbage_in_the_nodes_fifo_neither_hangs_nor_stops_it(home):
    """Whatever is written into the node's FIFO (not numbers, a huge line, the pid of
    the node itself, of init, of a process gone, several pids in one write) is passed
    over, and the real join that comes after is still taken."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    junk = b"hello\n-5\n\n" + b"9" * 50000 + b"\n1\n%d\n%d 2\n%d\n" % (
        os.getpid(), gone.pid, gone.pid)

    def write_junk(node):
        fd = os.open(node.fifo.path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, junk)
        os.close(fd)

    assert deliver(home, b"real", before=write_junk).endswith(b'{"ok":true,"result":null}\n')
    assert os.listdir(relay_dir(home)) == []


def test_pid_lines_take_only_whole_short_lines_of_digits():
    lines = PidLines()
    assert lines.feed(b"123\n45") == [123]
    assert lines.feed(b"6\n") == [456]                     # a line cut across two reads
    assert lines.feed(b"7\n8\n") == [7, 8]                 # two pids in one read
    assert lines.feed(b"abc\n12a\n-3\n+4\n 5\n\n0\n1\n") == [5]
    assert lines.feed(b"1" * 40) == []                     # a huge line, in pieces...
    assert lines.feed(b"2" * 40) == []
    assert lines.feed(b"345\n99\n") == [99]                # ...its tail is no pid
    assert lines.feed(b"12345678\n") == []                 # above any pid_max


def fake_proc(tmp_path, pid, target, owner=None):
    folder = tmp_path / "proc" / str(pid) / "fd"
    folder.mkdir(parents=True)
    os.symlink(str(target), str(folder / "0"))
    if owner is not None:
        os.lchown(str(folder.parent), owner, -1)
    return str(tmp_path / "proc")


def test_only_a_pipe_that_is_the_stdin_of_this_users_process_is_opened(tmp_path):
    """The node opens nothing else: a regular file, a socket, another user's process, a
    process that is gone, this node itself (its stdin is the controller's stream)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(str(fifo))
    keep = os.open(str(fifo), os.O_RDWR)   # a writer, as sshd is
    try:
        fd = open_stdin(4242, fake_proc(tmp_path / "a", 4242, fifo))
        assert fd is not None and os.path.sameopenfile(fd, keep)
        os.close(fd)
        secret = tmp_path / "secret"
        secret.write_text("not a stream")
        assert open_stdin(4242, fake_proc(tmp_path / "b", 4242, secret)) is None
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(tmp_path / "sock"))
        assert open_stdin(4242, fake_proc(tmp_path / "c", 4242, tmp_path / "sock")) is None
        sock.close()
        assert open_stdin(4242, str(tmp_path / "nothing")) is None      # gone
        assert open_stdin(os.getpid()) is None                         # the node itself
        if os.geteuid() == 0:                                           # chown needs root
            other = fake_proc(tmp_path / "d", 4242, fifo, owner=65534)
            assert open_stdin(4242, other) is None
    finally:
        os.close(keep)


def test_a_hops_join_line_checks_the_helper_and_falls_back_to_its_python_join():
    """The controller's line for a hop: the marker and the helper's check first (exit 97
    when it is missing), the shell join, then the helper's own sync.join with the host's
    python, quoted, and the request the relay appends as its argument."""
    from multihost import helper
    from multihost.hosts import Host
    from multihost.sync.transfer import hop_line

    line = hop_line(Host(name="gpu7", rank=6, python="/opt/my python/bin/python3"), "sync.join")
    assert line.startswith("printf '\\n%s\\n' " + helper.MARKER.decode())
    assert '[ -d "$H" ] || exit 97; mhs() {' in line
    assert line.endswith("exec '/opt/my python/bin/python3' -S -E \"$H/__main__.py\" "
                         "sync.join \"$1\"; }\nmhj")
    request = " " + shlex.quote(json.dumps({"token": TOKEN}))
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n", "-c", line + request]).returncode == 0
