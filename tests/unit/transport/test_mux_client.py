"""Commands through an OpenSSH master's control socket (transport/mux_client.py), against
a stand-in master that speaks the protocol as OpenSSH's mux.c does: it takes the
command and our three pipes, and plays the remote command on them. What a real master
does with them is the lab's (tests/lab/test_transport.py)."""
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading

import pytest

from multihost.errors import CommandTimeout
from multihost.hosts import Host
from multihost.transport import mux_client
from multihost.transport.openssh import MuxTransport


def _read_packet(conn):
    size = struct.unpack(">I", _exact(conn, 4))[0]
    return _exact(conn, size)


def _exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _send(conn, *words, text=None):
    body = struct.pack(">" + "I" * len(words), *words)
    if text is not None:
        body += struct.pack(">I", len(text)) + text
    conn.sendall(struct.pack(">I", len(body)) + body)


class StandIn:
    """A master at a socket path. ``play(command, stdin, stdout, stderr, gone)`` is the
    remote command (file descriptors it must close; ``gone`` is set when the client
    leaves, upon which a real master closes the session); it returns the exit status to
    report (None: the session ends without one). ``refuse``: the session is refused."""

    def __init__(self, path, play=None, refuse=None):
        self.commands = []
        self.play, self.refuse = play, refuse
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self.session, args=(conn,), daemon=True).start()

    def session(self, conn):
        with conn:
            assert struct.unpack(">II", _read_packet(conn)) == (mux_client.HELLO, 4)
            _send(conn, mux_client.HELLO, 4)
            request = _read_packet(conn)
            kind, rid = struct.unpack_from(">II", request)
            assert kind == mux_client.NEW_SESSION
            command = _last_string(request)
            self.commands.append(command.decode())
            fds = [socket.recv_fds(conn, 1, 1)[1][0] for _ in range(3)]
            if self.refuse:
                for fd in fds:
                    os.close(fd)
                _send(conn, mux_client.S_FAILURE, rid, text=self.refuse.encode())
                return
            _send(conn, mux_client.S_SESSION_OPENED, rid, 7)
            gone = threading.Event()
            threading.Thread(target=_watch, args=(conn, gone), daemon=True).start()
            status = self.play(command.decode(), *fds, gone)
            if status is not None:
                _send(conn, mux_client.S_EXIT_MESSAGE, 7, status)
            conn.shutdown(socket.SHUT_RDWR)   # the watcher's read holds it open otherwise


def _watch(conn, gone):
    try:
        conn.recv(1)
    except OSError:
        pass
    gone.set()


def _last_string(packet):
    """The command: the last string of a new-session request (no environment sent)."""
    offset = 8
    size = struct.unpack_from(">I", packet, offset)[0]           # reserved
    offset += 4 + size + 5 * 4                                   # four flags, escape char
    size = struct.unpack_from(">I", packet, offset)[0]           # terminal type
    offset += 4 + size
    size = struct.unpack_from(">I", packet, offset)[0]
    assert offset + 4 + size == len(packet)
    return packet[offset + 4:offset + 4 + size]


@pytest.fixture
def socket_path():
    directory = tempfile.mkdtemp(prefix="mhmux-", dir="/tmp")   # short: a socket's path
    os.chmod(directory, 0o700)
    yield os.path.join(directory, "master")
    shutil.rmtree(directory, ignore_errors=True)


def echo_upper(command, stdin, stdout, stderr, gone):
    """Reads its input, writes it back in capitals, says where it ran on stderr."""
    with os.fdopen(stdin, "rb") as i, os.fdopen(stdout, "wb") as o, os.fdopen(stderr, "wb") as e:
        e.write(b"\n=multihost-start= 4242\nran: " + command.encode().split(b"; ")[-1][:-1]
                + b"\n")
        o.write(i.read().upper())
    return 3


def test_a_command_gets_its_input_and_gives_its_output_error_and_status(socket_path):
    master = StandIn(socket_path, echo_upper)
    transport = MuxTransport(Host(name="gpu1"), socket_path)
    result = transport.run("tr a-z A-Z", input=b"x" * 300_000)   # past any pipe's buffer
    assert result.exit_code == 3 and result.stdout == b"X" * 300_000
    assert result.stderr == b"ran: tr a-z A-Z\n"          # the start marker taken out
    assert master.commands[0].startswith("exec sh -c '") and "tr a-z A-Z" in master.commands[0]


def test_a_started_command_streams_both_ways(socket_path):
    StandIn(socket_path, echo_upper)
    process = MuxTransport(Host(name="gpu1"), socket_path).start("cat")
    process.stdin.write(b"stream me")
    process.stdin.close()
    assert process.stdout.read() == b"STREAM ME"
    assert process.wait(10) == 3
    process.close()


def test_a_master_that_refuses_or_is_gone_ends_the_command_at_once_with_255(socket_path):
    StandIn(socket_path, refuse="Multiple sessions not supported")
    result = MuxTransport(Host(name="gpu1"), socket_path).run("true", timeout=10)
    assert result.exit_code == 255 and b"Multiple sessions not supported" in result.stderr
    os.unlink(socket_path)
    with socket.socket(socket.AF_UNIX) as stale:    # a socket no master listens on any more
        stale.bind(socket_path)
    result = MuxTransport(Host(name="gpu1"), socket_path).run("true", timeout=10)
    assert result.exit_code == 255 and b"refused" in result.stderr.lower()
    process = MuxTransport(Host(name="gpu1"), socket_path).start("cat")
    assert process.stdout.read() == b"" and process.wait(10) == 255
    process.close()


def test_a_session_that_ends_without_a_status_is_255_as_for_the_ssh_client(socket_path):
    def killed(command, stdin, stdout, stderr, gone):
        os.write(stderr, b"\n=multihost-start= 7\n")
        for fd in (stdin, stdout, stderr):
            os.close(fd)
    StandIn(socket_path, killed)
    assert MuxTransport(Host(name="gpu1"), socket_path).run("sleep 1").exit_code == 255


def test_a_command_past_its_timeout_is_given_up_and_its_group_ended(socket_path):
    ended = []

    def hangs(command, stdin, stdout, stderr, gone):
        if command.endswith("exit 0'"):          # the line that ends the group
            ended.append(command)
            for fd in (stdin, stdout, stderr):
                os.close(fd)
            return 0
        os.write(stderr, b"\n=multihost-start= 4242\n")
        gone.wait(30)   # the client gave up: the master closes the session
        for fd in (stdin, stdout, stderr):
            os.close(fd)
        return None

    StandIn(socket_path, hangs)
    with pytest.raises(CommandTimeout, match="did not finish within 1s"):
        MuxTransport(Host(name="gpu1"), socket_path).run("sleep 60", timeout=1)
    assert ended and "kill -TERM -4242 " in ended[0]


def test_wait_past_its_timeout_raises_as_popen_does(socket_path):
    release = threading.Event()

    def slow(command, stdin, stdout, stderr, gone):
        release.wait(30)
        for fd in (stdin, stdout, stderr):
            os.close(fd)
        return 0

    StandIn(socket_path, slow)
    channel = mux_client.MuxChannel(socket_path, "sleep 5")
    with pytest.raises(subprocess.TimeoutExpired):
        channel.wait(0.2)
    release.set()
    assert channel.wait(10) == 0
    channel.stdout.close()
    channel.stderr.close()


def test_a_master_that_never_answers_holds_a_command_no_longer_than_its_timeout(socket_path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen(1)

    def silent():   # takes the request, answers nothing, lets go once the client has
        conn, _ = server.accept()
        with conn:
            while conn.recv(65536):
                pass
    threading.Thread(target=silent, daemon=True).start()
    with pytest.raises(CommandTimeout, match="did not finish within 1s"):
        MuxTransport(Host(name="gpu1"), socket_path).run("true", timeout=1)
    server.close()
