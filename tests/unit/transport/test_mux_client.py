"""The controller's own client of an OpenSSH master (transport/mux_client.py): messages
byte for byte as PROTOCOL.mux lays them out, and a command through a stand-in master
(a thread speaking the master's side) with its input, output, errors and exit status,
and no process started; whatever keeps a session from opening falls back to `ssh`."""
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading

import pytest

from multihost.hosts import Host
from multihost.transport import mux_client
from multihost.transport.mux_client import MuxProtocolError, Reply, parse
from multihost.transport import SshOptions, openssh
from multihost.transport.openssh import MuxTransport


def test_the_hello_is_version_4_without_extensions():
    # uint32 length, uint32 MUX_MSG_HELLO (0x00000001), uint32 protocol version
    assert mux_client.hello() == bytes.fromhex("00000008" "00000001" "00000004")


def test_a_new_session_asks_for_no_tty_no_x11_no_agent_and_no_escape_character():
    body = bytes.fromhex(
        "10000002"            # MUX_C_NEW_SESSION
        "00000001"            # request id
        "00000000"            # string reserved (empty)
        "00000000"            # bool want tty
        "00000000"            # bool want X11 forwarding
        "00000000"            # bool want agent
        "00000000"            # bool subsystem
        "ffffffff"            # uint32 escape char: none
        "00000000"            # string terminal type (none: no tty)
        "00000007") + b"stat -L"   # string command
    assert mux_client.new_session(1, b"stat -L") == struct.pack(">I", len(body)) + body


def test_the_masters_replies_are_read_field_by_field():
    assert parse(bytes.fromhex("00000001" "00000004")) == Reply(mux_client.MUX_MSG_HELLO, 4)
    opened = parse(bytes.fromhex("80000006" "00000001" "00000003"))   # rid 1, session 3
    assert (opened.kind, opened.first, opened.second) == (mux_client.MUX_S_SESSION_OPENED, 1, 3)
    exited = parse(bytes.fromhex("80000004" "00000003" "0000002a"))   # session 3, exit 42
    assert (exited.kind, exited.first, exited.second) == (mux_client.MUX_S_EXIT_MESSAGE, 3, 42)
    refused = parse(bytes.fromhex("80000002" "00000001") + struct.pack(">I", 17)
                    + b"Permission denied")
    assert refused.reason == "Permission denied"


def test_a_reason_cannot_reach_a_terminal_raw():
    hostile = b"no\x1b]0;owned\x07 \x1b[2Jway"
    reply = parse(bytes.fromhex("80000003" "00000001") + struct.pack(">I", len(hostile)) + hostile)
    assert "\x1b" not in reply.reason and "\x07" not in reply.reason


@pytest.mark.parametrize("body", [b"", b"\x80\x00", bytes.fromhex("80000006" "00000001"),
                                  bytes.fromhex("7fffffff" "00000001"),
                                  bytes.fromhex("80000003" "00000001")])
def test_a_short_or_unknown_message_is_not_the_protocol(body):
    with pytest.raises(MuxProtocolError):
        parse(body)


# -- a stand-in master ------------------------------------------------------------------

def frame(*words, text=None):
    body = struct.pack(f">{len(words)}I", *words)
    if text is not None:
        body += struct.pack(">I", len(text)) + text
    return struct.pack(">I", len(body)) + body


def read_frame(conn):
    head = b""
    while len(head) < 4:
        more = conn.recv(4 - len(head))
        if not more:
            return None
        head += more
    (size,) = struct.unpack(">I", head)
    body = b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return body


class Master:
    """One connection's worth of a master. The command it runs: its input upper-cased to
    stdout, "warn" to stderr, then ``status`` (``status=None``: no exit message;
    ``hold``: the command runs until the client goes away)."""

    def __init__(self, path, version=4, refuse=None, status=0, answer=True, hold=False):
        self.path, self.version, self.refuse = path, version, refuse
        self.status, self.answer, self.hold = status, answer, hold
        self.request = None
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        conn, _ = self.server.accept()
        with conn:
            read_frame(conn)
            if not self.answer:
                conn.recv(1)  # until the client gives up
                return
            conn.sendall(frame(mux_client.MUX_MSG_HELLO, self.version))
            self.request = read_frame(conn)
            if self.request is None:
                return
            fds = []
            for _ in range(3):
                _, got, _, _ = socket.recv_fds(conn, 1, 1)
                fds += got
            if self.refuse:
                conn.sendall(frame(self.refuse, 1, text=b"Permission denied"))
            else:
                conn.sendall(frame(mux_client.MUX_S_SESSION_OPENED, 1, 7))
                if self.hold:
                    conn.recv(1)
                else:
                    data = b""
                    while chunk := os.read(fds[0], 65536):
                        data += chunk
                    os.write(fds[1], data.upper())
                    os.write(fds[2], b"warn\n")
            for fd in fds:
                os.close(fd)
            if self.status is not None and not self.refuse and not self.hold:
                conn.sendall(frame(mux_client.MUX_S_EXIT_MESSAGE, 7, self.status))


@pytest.fixture
def place():
    directory = tempfile.mkdtemp(prefix="mh-mux-", dir="/tmp")   # short: a socket's path
    os.chmod(directory, 0o700)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def no_process(monkeypatch):
    """Starting any process fails the test: the master is spoken to directly."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


def transport(place, timeout=5.0):
    """Through the socket at ``place``/m; its fallback `ssh` is a local shell marked
    FALLBACK (what ran it shows in the output)."""
    mux = MuxTransport(Host(name="gpu1"), ["/bin/sh", "-c"], os.path.join(place, "m"), timeout)
    mux._argv = lambda line: ["/bin/sh", "-c", "echo FALLBACK; " + line]
    return mux


def test_a_command_gets_its_input_output_errors_and_status_without_a_process(place, no_process):
    master = Master(os.path.join(place, "m"), status=3)
    done = transport(place).run(["cat", "a b"], input=b"names\n")
    assert (done.stdout, done.stderr, done.exit_code) == (b"NAMES\n", b"warn\n", 3)
    assert master.request.endswith(b"\x00\x00\x00\x09cat 'a b'")   # quoted as ever


def test_a_started_command_streams_through_pipes(place, no_process):
    Master(os.path.join(place, "m"))
    process = transport(place).start("cat")
    process.stdin.write(b"one\n")
    process.stdin.close()
    assert process.stdout.read() == b"ONE\n"
    assert process.read_stderr() == b"warn\n"
    assert process.wait(10) == 0
    process.close()


def test_a_session_that_ends_without_an_exit_message_is_255(place, no_process):
    Master(os.path.join(place, "m"), status=None)
    assert transport(place).run("cat", input=b"x").exit_code == 255


def test_a_hosts_exit_status_is_taken_as_ssh_takes_it(place, no_process):
    Master(os.path.join(place, "m"), status=0x100 + 4)   # an exit status no process has
    assert transport(place).run("cat").exit_code == 4


def test_a_killed_command_waits_no_longer(place, no_process):
    Master(os.path.join(place, "m"), hold=True)
    process = transport(place).start("sleep 600")
    process.kill()
    assert process.wait(10) < 0
    process.close()


@pytest.mark.parametrize("master", [
    dict(version=3),                                         # an OpenSSH of another version
    dict(refuse=mux_client.MUX_S_PERMISSION_DENIED),         # ControlMaster=ask said no
    dict(refuse=mux_client.MUX_S_FAILURE),                   # the host refused a session
    None,                                                    # a socket left by a dead master
])
def test_whatever_keeps_a_session_from_opening_falls_back_to_the_ssh_client(place, master):
    path = os.path.join(place, "m")
    if master is None:
        left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        left.bind(path)       # the file stays; nobody listens
        left.close()
    else:
        Master(path, **master)
    done = transport(place, timeout=1.0).run("echo ran")
    assert done.stdout == b"FALLBACK\nran\n" and done.exit_code == 0
    process = transport(place, timeout=1.0).start("echo ran")
    assert process.stdout.read() == b"FALLBACK\nran\n"
    assert process.wait(10) == 0


def a_socket_of_ours(place, monkeypatch):
    """The control socket's path for host gpu1 under HOME=``place``, its directory made."""
    monkeypatch.setenv("HOME", place)
    monkeypatch.delenv("MULTIHOST_CONTROL_PERSIST", raising=False)
    path = openssh.control_path(Host(name="gpu1"), SshOptions())
    os.makedirs(os.path.dirname(path), mode=0o700)
    return path


def test_a_master_that_does_not_answer_holds_up_nothing_more(place, monkeypatch):
    """It took the request and is stuck: the session is given up after SESSION_TIMEOUT,
    and the `ssh` client after it does not wait on that master again (ControlPath=none,
    ProxyCommand=false: exit 255 at once; the caller goes the paramiko way)."""
    monkeypatch.setattr(openssh, "SESSION_TIMEOUT", 0.5)
    Master(a_socket_of_ours(place, monkeypatch), answer=False)
    mux = MuxTransport.open(Host(name="gpu1"), SshOptions())
    done = mux.run("echo ran", timeout=60)
    assert done.exit_code == 255 and done.stdout == b""
    assert "ControlPath=none" in mux._argv("x")   # an `ssh` through it would wait too


def test_a_socket_whose_directory_became_open_to_others_is_never_used(place, monkeypatch):
    """Not by the controller, nor by the `ssh` client it falls back to: that one is told
    ControlPath=none and, with ProxyCommand=false, fails at once as with no master."""
    host = Host(name="gpu1")
    path = a_socket_of_ours(place, monkeypatch)
    master = Master(path)
    mux = MuxTransport.open(host, SshOptions())
    os.chmod(os.path.dirname(path), 0o777)
    done = mux.run("echo ran", timeout=60)
    assert done.exit_code == 255 and done.stdout == b""
    assert master.request is None                       # nobody spoke to it
    assert "ControlPath=none" in mux._argv("x")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to listen as another user")
def test_a_socket_answered_by_another_users_process_is_never_used(place, monkeypatch):
    host = Host(name="gpu1")
    path = a_socket_of_ours(place, monkeypatch)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the socket's listener: another user's process
        try:
            os.setuid(65534)
            server.listen(1)
            os.write(ready_w, b"1")
            conn, _ = server.accept()
            conn.sendall(frame(mux_client.MUX_MSG_HELLO, 4))
            conn.recv(1 << 16)
        finally:
            os._exit(0)
    server.close()
    try:
        assert os.read(ready_r, 1) == b"1"
        mux = MuxTransport.open(host, SshOptions())
        done = mux.run("echo ran", timeout=60)
        assert done.exit_code == 255 and done.stdout == b""
        assert "ControlPath=none" in mux._argv("x")
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(ready_w)
