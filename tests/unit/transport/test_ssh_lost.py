"""A connection that died says why, as its reader saw it: the host closing it and a link
the kernel gave up on (nothing acknowledged for ssh_login.DEAD_LINK) are two causes."""
import errno
from types import SimpleNamespace

import pytest

from multihost.errors import ConnectError
from multihost.hosts import Host
from multihost.transport.ssh import SshTransport


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
