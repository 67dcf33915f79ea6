"""The relay chain of a first sync on 9 real hosts: every node started at once by the
controller, each host fed by the one before it; a middle host the chain cannot use is
gone around, named, and sent its files by the controller; nothing is left on any host."""
import json
import secrets

import pytest

HOSTS = 9  # the lab9 fixture: more than a chain used to be allowed (8), beyond, a tree
ALL = tuple(range(1, HOSTS + 1))


@pytest.fixture
def workdir():
    return f"/root/relay-{secrets.token_hex(3)}"


def host_lines(stdout: str, address: str) -> str:
    return "\n".join(l for l in stdout.splitlines() if l.startswith(f"{address}: "))


def assert_everyone_has_it(lab, relay_code, workdir):
    want = lab.tree_digest(relay_code)
    for i in ALL:
        assert lab.tree_digest(lab.host_path(i, workdir)) == want, f"host {i}"


def test_a_relay_of_nine_hosts_is_one_chain_each_host_fed_by_the_one_before_it(lab9, relay_code, workdir):
    ips = ",".join(lab9.address(i) for i in ALL)
    done = lab9.multihost("sync", "--ips", ips, "--code", str(relay_code), "--workdir", workdir,
                          "--plain")
    assert done.returncode == 0, done.stderr
    assert_everyone_has_it(lab9, relay_code, workdir)
    for i in ALL[1:]:          # 17 MB came host to host to every host but the head
        assert "came host to host" in host_lines(done.stdout, lab9.address(i)), done.stdout
    for i in ALL[2:]:          # a chain: host i was reached by host i-1
        log = (lab9.lab.paths.host_log(i) / "sshd.log").read_text()
        assert f"from {lab9.address(i - 1)}" in log
    lab9.assert_no_relay_left(ALL)


SCRIPT = """
import json
import sys
import multihost
from multihost.sync.pipeline import sync_code
code, workdir, ips = sys.argv[1:4]
with multihost.Cluster.from_ips(ips)._connect() as cluster:
    for host in cluster.hosts:
        cluster.transport(host).run("true")
    print("connected", flush=True)
    sys.stdin.readline()
    report = sync_code(cluster, code, workdirs={h.rank: workdir for h in cluster.hosts})
    print(json.dumps([[h.host, h.ok, h.relayed_bytes, list(h.notes)] for h in report.hosts]))
"""


def test_a_middle_host_whose_sshd_stopped_is_gone_around_and_synced_directly(lab9, relay_code, workdir):
    """Host 3's sshd stops after the controller connected to every host: host 2 cannot
    reach it, so the chain goes 2 -> 4; host 3 gets its files over the controller's
    open connection, and the report names it with the cause."""
    ips = ",".join(lab9.address(i) for i in ALL)
    out = lab9.controller_script(SCRIPT, [str(relay_code), workdir, ips], stopped=3)
    hosts = {host: (ok, relayed, notes) for host, ok, relayed, notes in json.loads(out.splitlines()[-1])}
    assert all(ok for ok, _, _ in hosts.values())
    assert_everyone_has_it(lab9, relay_code, workdir)
    _, relayed, notes = hosts[lab9.address(3)]
    assert relayed == 0
    assert any(f"host-to-host ssh to {lab9.address(3)} failed" in n and
               "sent from the controller instead" in n for n in notes), notes
    for i in (2, 4, 5, 6, 7, 8, 9):      # the others still came host to host
        assert hosts[lab9.address(i)][1] > 0, (i, hosts)
    lab9.assert_no_relay_left(ALL)


def test_a_middle_host_without_a_usable_relay_directory_is_named_and_synced(lab9, relay_code, workdir):
    """Host 3 cannot make its rendezvous (its relay directory is a file): the host is
    named with the cause, the chain goes around it, every host gets the files."""
    blocker = lab9.lab.paths.host_root(3) / ".cache" / "multihost" / "relay"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    if blocker.is_dir():
        blocker.rmdir()
    blocker.write_text("")
    try:
        ips = ",".join(lab9.address(i) for i in ALL)
        done = lab9.multihost("sync", "--ips", ips, "--code", str(relay_code), "--workdir", workdir,
                              "--plain")
    finally:
        blocker.unlink()
    assert done.returncode == 0, done.stderr
    assert_everyone_has_it(lab9, relay_code, workdir)
    note = next(l for l in done.stdout.splitlines() if "note:" in l)
    assert f"{lab9.address(3)}: cannot make /root/.cache/multihost/relay: File exists; sent from " \
           "the controller instead" in note, done.stdout
    lab9.assert_no_relay_left(ALL)
