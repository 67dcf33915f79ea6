"""A relay hop's join on real hosts: the login shell joins the node with no Python
start (remote/sync_shelljoin.py); where the node cannot open the hop's stdin it sends
the shell to Python's join, and the chain delivers all the same; nothing is left."""
import contextlib
import secrets

import pytest

from multihost.remote.sync_shelljoin import PYTHON_JOIN_ENV

ALL = (1, 2, 3, 4)


@pytest.fixture
def workdir():
    return f"/root/shelljoin-{secrets.token_hex(3)}"


@contextlib.contextmanager
def bashrc(lab, hosts, text):
    """Hosts' root get this ~/.bashrc (bash reads it for every command sshd starts)."""
    for i in hosts:
        lab.host_run(i, ["sh", "-c", "cat > /root/.bashrc"], input=text, check=True)
    try:
        yield
    finally:
        for i in hosts:
            lab.host_run(i, ["rm", "-f", "/root/.bashrc"])


def sync_all(lab, relay_code, workdir):
    done = lab.multihost("sync", "--ips", ",".join(lab.address(i) for i in ALL), "--code",
                         str(relay_code), "--workdir", workdir, "--plain")
    assert done.returncode == 0, done.stderr
    want = lab.tree_digest(relay_code)
    for i in ALL:
        got = lab.tree_digest(lab.host_path(i, workdir))
        assert got == want, f"host {i}"
    for i in ALL[1:]:          # the 17 MB came host to host to every host but the head
        line = "\n".join(l for l in done.stdout.splitlines() if l.startswith(f"{lab.address(i)}: "))
        assert "came host to host" in line, done.stdout
    assert "sent from the controller instead" not in done.stdout, done.stdout
    lab.assert_no_relay_left(ALL)   # no node, no join, no socket or FIFO


def test_a_chain_of_shell_joins_delivers_everything_even_to_chatty_shells(lab, relay_code, workdir):
    noise = "echo Welcome to $(hostname)\necho 'a banner' >&2\nprintf 'no newline'\n"
    with bashrc(lab, (2, 3), noise):
        sync_all(lab, relay_code, workdir)


def test_hosts_whose_nodes_cannot_open_the_hops_stdin_join_with_python(lab, relay_code, workdir):
    """Hosts 3 and 4 act as hosts without a usable /proc (the nodes' test hook): their
    nodes answer the shell join "use Python's join", which hands its stdin over the
    socket; the chain goes through them all the same."""
    with bashrc(lab, (3, 4), f"export {PYTHON_JOIN_ENV}=1\n"):
        sync_all(lab, relay_code, workdir)
