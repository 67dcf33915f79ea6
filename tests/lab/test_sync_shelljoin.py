"""A relay hop's join on real hosts: the login shell joins the node with no Python
start (remote/sync_shelljoin.py); where the node cannot open the hop's stdin it sends
the shell to Python's join, and the chain delivers all the same; nothing is left."""
import contextlib
import hashlib
import os
import secrets
from pathlib import Path

import pytest

from multihost.remote.sync_shelljoin import PYTHON_JOIN_ENV

ALL = (1, 2, 3, 4)


@pytest.fixture
def code(tmp_path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    for i in range(5):
        (root / "pkg" / f"m{i}.py").write_text(f"VALUE = {i}\n")
    (root / "weights.bin").write_bytes(os.urandom(17 << 20))   # heavy enough to relay
    return root


@pytest.fixture
def workdir():
    return f"/root/shelljoin-{secrets.token_hex(3)}"


def digest_tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


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


def sync_all(lab, code, workdir):
    done = lab.multihost("sync", "--ips", ",".join(lab.address(i) for i in ALL), "--code",
                         str(code), "--workdir", workdir, "--plain")
    assert done.returncode == 0, done.stderr
    want = digest_tree(code)
    for i in ALL:
        got = digest_tree(lab.lab.paths.host_root(i) / Path(workdir).relative_to("/root"))
        assert got == want, f"host {i}"
    for i in ALL[1:]:          # the 17 MB came host to host to every host but the head
        line = "\n".join(l for l in done.stdout.splitlines() if l.startswith(f"{lab.address(i)}: "))
        assert "came host to host" in line, done.stdout
    assert "sent from the controller instead" not in done.stdout, done.stdout
    lab.assert_no_relay_left(ALL)   # no node, no join, no socket or FIFO


def test_a_chain_of_shell_joins_delivers_everything_even_to_chatty_shells(lab, code, workdir):
    noise = "echo Welcome to $(hostname)\necho 'a banner' >&2\nprintf 'no newline'\n"
    with bashrc(lab, (2, 3), noise):
        sync_all(lab, code, workdir)


def test_hosts_whose_nodes_cannot_open_the_hops_stdin_join_with_python(lab, code, workdir):
    """Hosts 3 and 4 act as hosts without a usable /proc (the nodes' test hook): their
    nodes answer the shell join "use Python's join", which hands its stdin over the
    socket; the chain goes through them all the same."""
    with bashrc(lab, (3, 4), f"export {PYTHON_JOIN_ENV}=1\n"):
        sync_all(lab, code, workdir)
