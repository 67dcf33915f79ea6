"""A connection that died says why, as its reader saw it: the host closing it and a link
the kernel gave up on (nothing acknowledged for ssh_login.DEAD_LINK) are two causes. And
the controller never makes sshd close one: a channel's EOF never follows its CLOSE."""
import errno
import logging
import threading
from types import SimpleNamespace

import paramiko
import pytest

from multihost.errors import ConnectError
from multihost.hosts import Host
from multihost.transport.ssh import SshTransport, send_eof


def lost(saved):
    ended = SimpleNamespace(is_active=lambda: False, saved_exception=saved)
    client = SimpleNamespace(get_transport=lambda: ended)
    transport = SshTransport(Host("198.18.0.63"), client, SimpleNamespace(connect_timeout=10))
    with pytest.raises(ConnectError) as raised:
        transport.run("true")
    assert raised.value.kind == ConnectError.LOST and raised.value.host == "198.18.0.63"
    return raised.value.cause


def test_a_lost_connection_names_what_ended_it():
    timed_out = OSError(errno.ETIMEDOUT, "Connection timed out")
    assert lost(timed_out) == "the ssh connection was lost ([Errno 110] Connection timed out)"
    assert lost(EOFError()) == "the ssh connection was lost (the host closed it)"
    assert lost(None) == "the ssh connection was lost"


class Wire:
    """A transport as paramiko's channel sees it; ``sent``: the messages in wire order.
    The command ends while the controller's EOF is on its way: paramiko's reader answers
    the host's CLOSE at that moment, from its own thread."""

    def __init__(self):
        self.clear_to_send = threading.Event()
        self.clear_to_send.set()
        self.clear_to_send_lock = threading.Lock()
        self.sent = []
        self.channel = None
        self.reader = None

    def is_active(self):
        return True

    def _the_host_closes_now(self, message):
        if self.reader is None and message.asbytes()[0] == EOF:
            self.reader = threading.Thread(target=self.channel._handle_close, args=(None,))
            self.reader.start()
            self.reader.join(0.5)   # it answers now, unless something makes it wait

    def _send_message(self, message):   # the send lock is held
        self._the_host_closes_now(message)
        self.sent.append(message.asbytes()[0])

    def _send_user_message(self, message):   # paramiko's: takes the send lock
        self._the_host_closes_now(message)
        with self.clear_to_send_lock:
            self.sent.append(message.asbytes()[0])

    def _unlink_channel(self, chanid):
        pass


EOF, CLOSE = 96, 97


def channel_on(wire):
    channel = paramiko.Channel(0)
    channel.transport, channel.remote_chanid, channel.active = wire, 0, True
    channel.logger = logging.getLogger("test")
    wire.channel = channel
    return channel


def test_the_eof_goes_out_before_the_close_of_a_command_that_ends_meanwhile():
    """sshd drops the whole connection on an EOF after the channel's CLOSE."""
    wire = Wire()
    send_eof(channel_on(wire))
    wire.reader.join(30)
    assert wire.sent == [EOF, CLOSE]


def test_a_channel_already_closed_gets_no_eof():
    wire = Wire()
    channel = channel_on(wire)
    channel._handle_close(None)   # the host's CLOSE came first: answered with EOF, CLOSE
    send_eof(channel)
    assert wire.sent == [EOF, CLOSE]


def test_a_connection_the_host_closes_as_a_stream_starts_is_a_lost_host_not_a_traceback():
    class Refusing:
        closed = False

        def exec_command(self, line):
            raise EOFError()   # paramiko, when the host closed the connection meanwhile

        def close(self):
            self.closed = True

    channel = Refusing()
    live = SimpleNamespace(is_active=lambda: True, open_session=lambda timeout: channel)
    client = SimpleNamespace(get_transport=lambda: live)
    transport = SshTransport(Host("198.18.0.12"), client, SimpleNamespace(connect_timeout=10))
    with pytest.raises(ConnectError) as raised:
        transport.start("sleep 1")
    assert raised.value.kind == ConnectError.LOST and raised.value.host == "198.18.0.12"
    assert raised.value.fix == "check the host and the network" and channel.closed
