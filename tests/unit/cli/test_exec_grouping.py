"""`multihost exec` output: identical hosts folded once, errors after, exit = the largest."""
import io

from multihost.commands.exec import print_grouped
from multihost.errors import ConnectError
from multihost.fanout import HostResult
from multihost.hosts import Host
from multihost.transport import CommandResult


def result(rank, code=0, out=b"ok\n", err=b""):
    host = Host(name=f"10.0.0.{rank + 1}", rank=rank)
    return HostResult(host, value=CommandResult(host.label, "x", code, out, err, 0.0))


def test_identical_hosts_are_shown_once_under_folded_names():
    out, err = io.StringIO(), io.StringIO()
    status = print_grouped([result(0), result(1), result(2, code=3, out=b"bad\n"), result(3)], out, err)
    text = out.getvalue()
    assert "10.0.0.[1-2,4] (3)\n" in text and "10.0.0.3 (1) exit 3\n" in text
    assert text.count("ok\n") == 1 and status == 3


def test_unreachable_host_is_reported_and_exit_is_255():
    out, err = io.StringIO(), io.StringIO()
    dead = HostResult(Host(name="10.0.0.9", rank=1),
                      error=ConnectError("no answer", host="10.0.0.9", kind=ConnectError.TIMEOUT,
                                         fix="ping it"))
    status = print_grouped([result(0), dead], out, err)
    assert "10.0.0.9: no answer (fix: ping it)" in err.getvalue() and status == 255
