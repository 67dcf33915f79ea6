"""The local transport: the single-machine case needs no sshd, and quoting is exact."""
import socket

import paramiko
import pytest

from multihost.errors import CommandTimeout
from multihost.hosts import Host
from multihost.transport import BrokenStream, LocalTransport, is_local_host, to_shell
from multihost.transport.ssh import ChannelInput


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "127.0.0.2", socket.gethostname()])
def test_this_machine_is_local(name):
    assert is_local_host(Host(name=name))


@pytest.mark.parametrize("host", [
    Host(name="198.18.0.99"), Host(name="127.0.0.1", port=2222),
    Host(name="127.0.0.1", user="somebody-else"), Host(name="gpu-node-3"),
])
def test_other_hosts_or_explicit_ssh_are_not_local(host):
    assert not is_local_host(host)


def test_argv_reaches_the_command_verbatim():
    hostile = ["a b", "it's", "$(touch /tmp/pwned)", "`id`", "x; rm -rf /", "line1\nline2"]
    result = LocalTransport(Host(name="127.0.0.1")).run(
        ["python3", "-c", "import sys; print(repr(sys.argv[1:]))", *hostile])
    assert result.ok and result.text().strip() == repr(hostile)


def test_string_commands_are_shell_lines_on_purpose():
    result = LocalTransport(Host(name="127.0.0.1")).run("echo $((6*7)) | tr 4 X")
    assert result.text() == "X2\n"


def test_cwd_is_quoted(tmp_path):
    odd = tmp_path / "dir with 'quote'"
    odd.mkdir()
    result = LocalTransport(Host(name="127.0.0.1")).run(["pwd"], cwd=str(odd))
    assert result.text().strip() == str(odd)


def test_home_relative_paths_stay_expandable():
    assert to_shell(["ls"], cwd="~/my dir") == "cd \"$HOME\"/'my dir' && ls"


def test_exit_status_and_stderr_are_kept():
    result = LocalTransport(Host(name="127.0.0.1")).run("echo out; echo err >&2; exit 7")
    assert (result.exit_code, result.stdout, result.stderr) == (7, b"out\n", b"err\n")


def test_timeout_names_the_host():
    with pytest.raises(CommandTimeout) as info:
        LocalTransport(Host(name="127.0.0.1")).run("sleep 5", timeout=0.2)
    assert info.value.host == "127.0.0.1"


def test_writing_to_a_command_that_exited_is_a_broken_stream():
    # A pipe says BrokenPipeError; the transport says BrokenStream, as over ssh.
    process = LocalTransport(Host(name="127.0.0.1")).start("exit 0")
    process.wait(10)
    with pytest.raises(BrokenStream):
        for _ in range(64):  # past the pipe's buffer
            process.stdin.write(b"x" * 65536)
            process.stdin.flush()
    process.close()


def test_writing_after_end_of_input_is_a_broken_stream():
    # A closed pipe file says ValueError; the transport says BrokenStream.
    process = LocalTransport(Host(name="127.0.0.1")).start("cat")
    process.stdin.close()
    process.stdin.close()  # end of input is sent once; a second close is harmless
    with pytest.raises(BrokenStream):
        process.stdin.write(b"late")
    assert process.wait(10) == 0
    process.close()


class _ChannelFile:
    def __init__(self, error):
        self.error = error
        self.closed = False

    def write(self, data):
        raise self.error

    def flush(self):
        pass

    def close(self):
        self.closed = True


class _Channel:
    def __init__(self, error):
        self.file = _ChannelFile(error)
        self.shut = 0

    def makefile_stdin(self, mode):
        return self.file

    def shutdown_write(self):
        self.shut += 1


@pytest.mark.parametrize("error", [paramiko.SSHException("SSH session not active"), EOFError(),
                                   OSError("Socket is closed")])
def test_paramikos_own_stream_errors_are_a_broken_stream(error):
    stdin = ChannelInput(_Channel(error))
    with pytest.raises(BrokenStream) as info:
        stdin.write(b"data")
    assert str(info.value)  # names the cause, even for a bare EOFError


def test_end_of_input_on_a_channel_shuts_its_write_side_once_and_keeps_the_file(monkeypatch):
    # closing paramiko's file would make its __del__ close it again and print noise
    channel = _Channel(OSError())
    monkeypatch.setattr("multihost.transport.ssh.send_eof", lambda c: c.shutdown_write())
    stdin = ChannelInput(channel)
    stdin.close()
    stdin.close()
    assert channel.shut == 1 and not channel.file.closed
