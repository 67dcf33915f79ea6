"""A command's output is read whole, however its last bytes, EOF, exit status and close
interleave with the reader (paramiko's thread fills the buffers while we test them)."""
from multihost.transport.ssh import _drain


class RacingChannel:
    """A channel whose output, exit status and close all land between the reader's look
    at the buffers and its test for the end: the race that lost `hostname`'s line."""

    def __init__(self):
        self.buffer = []
        self.closed = False
        self.eof_received = False

    def recv_ready(self):
        return bool(self.buffer)

    def recv(self, _size):
        return self.buffer.pop(0)

    def recv_stderr_ready(self):
        return False

    def exit_status_ready(self):
        if not self.closed:  # after the first, empty look: everything arrives at once
            self.buffer.append(b"h1\n")
            self.closed = self.eof_received = True
        return True


def test_output_that_arrives_with_the_close_is_kept():
    stdout, stderr = _drain(RacingChannel(), deadline=None)
    assert stdout == b"h1\n"
    assert stderr == b""
