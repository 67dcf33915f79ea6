"""A first sync through a relay chain on real sshd hosts: a host whose sync session made
its plan is its relay node in that same process. Every helper start on a host is
counted by the interpreter itself (``--python`` is a wrapper that notes the operation
and execs python3), so what is asserted is what ran on the host, not what the
controller meant to start."""
import secrets
import shutil

import pytest

HOSTS = (1, 2, 3, 4)


@pytest.fixture
def counted_python(lab):
    """The path, on every host, of a python3 that appends the helper operation it runs
    to ``/root/<name>.log`` first; yields (path, a function giving host i's ops)."""
    name = f"countpy-{secrets.token_hex(3)}"
    for i in HOSTS:
        wrapper = lab.lab.paths.host_root(i) / name
        # a helper call is `PYTHON -S -E HELPER/__main__.py OP REQUEST`: OP is the 4th word
        wrapper.write_text(f'#!/bin/sh\necho "$4" >> /root/{name}.log\nexec python3 "$@"\n')
        wrapper.chmod(0o755)

    def ops(i):
        log = lab.lab.paths.host_root(i) / f"{name}.log"
        return log.read_text().split() if log.exists() else []

    yield f"/root/{name}", ops
    for i in HOSTS:
        for leftover in (name, f"{name}.log"):
            (lab.lab.paths.host_root(i) / leftover).unlink(missing_ok=True)


def test_a_chained_host_runs_one_helper_its_session_being_its_relay_node(lab, relay_code,
                                                                         counted_python):
    """...and its hop's one `sync.join` hands it the stream, also where no relay ever ran."""
    python, ops = counted_python
    workdir = f"/root/innode-{secrets.token_hex(3)}"
    for i in HOSTS:  # hosts that never relayed: no relay directory yet
        shutil.rmtree(lab.host_path(i, "/root/.cache/multihost/relay"), ignore_errors=True)
    done = lab.multihost("sync", "--ips", ",".join(lab.address(i) for i in HOSTS),
                         "--python", python, "--code", str(relay_code), "--workdir", workdir,
                         "--plain")
    assert done.returncode == 0, done.stderr
    want = lab.tree_digest(relay_code)
    for i in HOSTS:
        assert lab.tree_digest(lab.host_path(i, workdir)) == want, f"host {i}"
    for i in HOSTS[1:]:
        assert any(l.startswith(f"{lab.address(i)}: ") and "came host to host" in l
                   for l in done.stdout.splitlines()), done.stdout
        # one helper started by the controller: the session, which was also the node
        started = [op for op in ops(i) if op in ("sync.session", "sync.receive")]
        assert started == ["sync.session"], (i, ops(i))
        # and the hop from the host before it: one join
        assert ops(i).count("sync.join") == 1, (i, ops(i))
    # the head still reads the controller's stream through its own `sync.receive`
    # (OpenSSH's C crypto, not the session's channel)
    assert sorted(op for op in ops(1) if op.startswith("sync.")) == ["sync.receive",
                                                                    "sync.session"], ops(1)
    lab.assert_no_relay_left(HOSTS)
    again = lab.multihost("sync", "--ips", ",".join(lab.address(i) for i in HOSTS),
                          "--python", python, "--code", str(relay_code), "--workdir", workdir,
                          "--plain")
    assert again.returncode == 0 and again.stdout.count("up to date") == len(HOSTS), again.stdout
