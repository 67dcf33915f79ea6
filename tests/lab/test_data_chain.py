"""--sync-data's push on 6 real hosts: one relay chain whose nodes the controller starts on
every receiving host at once, fed by the first host; a middle host the chain cannot
reach is gone around and named while the others get their data; nothing is left on
any host."""
import json
import os
import secrets

import pytest


HOSTS = 6  # the lab6 fixture: the first host and a chain of 5
ALL = tuple(range(1, HOSTS + 1))

# The controller, in a process of its own: it connects to every host first (so a host
# can lose its sshd afterwards), then repairs the dataset; every helper it starts is
# recorded (which host, which operation, which request).
SCRIPT = """
import json
import sys

import multihost
from multihost import helper
from multihost.data import sync_data

path, ips = sys.argv[1:3]
launched = []
real_launch = helper.launch


def launch(transport, op, request=None):
    launched.append([transport.host.label, op, request])
    return real_launch(transport, op, request)


helper.launch = launch
with multihost.Cluster.from_ips(ips)._connect() as cluster:
    for host in cluster.hosts:
        cluster.transport(host).run("true")
    print("connected", flush=True)
    sys.stdin.readline()
    report = sync_data(cluster, [path])
    print(json.dumps({"hosts": [[h.host, h.files, h.bytes, h.error, h.fix] for h in report.hosts],
                      "launched": launched}))
"""


@pytest.fixture
def dataset(lab6):
    """A dataset on the first host only: every other host needs all of it."""
    path = f"/root/ds-{secrets.token_hex(3)}"
    root = lab6.host_path(1, path)
    (root / "train").mkdir(parents=True)
    for n in range(30):
        (root / "train" / f"{n:03}.jpg").write_bytes(os.urandom(1000 + n))
    (root / "shard.bin").write_bytes(os.urandom(3 << 20))
    return path


def repair(lab, path, stopped=None):
    """Run the controller's repair (with host ``stopped``'s sshd down once it is connected);
    returns (hosts by address: (files, bytes, error, fix), helpers launched)."""
    out = lab.controller_script(SCRIPT, [path, ",".join(lab.address(i) for i in ALL)], stopped)
    answer = json.loads(out.splitlines()[-1])
    return {h[0]: tuple(h[1:]) for h in answer["hosts"]}, answer["launched"]


def test_a_data_push_is_one_chain_whose_nodes_the_controller_starts(lab6, dataset):
    hosts, launched = repair(lab6, dataset)
    want = lab6.tree_digest(lab6.host_path(1, dataset))
    for i in ALL[1:]:
        assert lab6.tree_digest(lab6.host_path(i, dataset)) == want, f"host {i}"
        files, size, error, _ = hosts[lab6.address(i)]
        assert error is None and files == 31 and size == sum(
            p.stat().st_size for p in lab6.host_path(1, dataset).rglob("*") if p.is_file())
    # Every receiving host's node was started by the controller, listening, all in one
    # chain (one token); the first host only feeds it.
    nodes = {label: request for label, op, request in launched if op == "sync.receive"}
    assert sorted(nodes) == sorted(lab6.address(i) for i in ALL[1:])
    assert all(r["relay"]["listen"] for r in nodes.values())
    assert len({r["relay"]["token"] for r in nodes.values()}) == 1
    pushes = [(label, request) for label, op, request in launched if op == "sync.push"]
    assert [label for label, _ in pushes] == [lab6.address(1)]
    assert pushes[0][1]["relay"]["token"] == next(iter(nodes.values()))["relay"]["token"]
    # The bytes went host to host, each host fed by the one before it.
    for i in ALL[1:]:
        log = (lab6.lab.paths.host_log(i) / "sshd.log").read_text()
        assert f"from {lab6.address(i - 1)}" in log, i
    lab6.assert_no_relay_left(ALL)


def test_a_middle_host_whose_sshd_stopped_is_named_and_the_others_get_their_data(lab6, dataset):
    """Host 4's sshd stops after the controller connected to every host: host 3 cannot
    reach it, so the chain goes 3 -> 5; host 4 is named with the cause and the fix."""
    hosts, _ = repair(lab6, dataset, stopped=4)
    want = lab6.tree_digest(lab6.host_path(1, dataset))
    for i in (2, 3, 5, 6):
        assert lab6.tree_digest(lab6.host_path(i, dataset)) == want, f"host {i}"
        assert hosts[lab6.address(i)][2] is None, hosts
    files, _, error, fix = hosts[lab6.address(4)]
    assert files == 0
    assert f"host-to-host ssh to {lab6.address(4)} failed" in error, error
    assert f"ssh to {lab6.address(4)} without a password" in fix, fix
    assert not lab6.host_path(4, dataset).exists()
    lab6.assert_no_relay_left(ALL)


def test_a_head_the_first_host_cannot_reach_is_gone_around_and_named(lab6, dataset):
    """Host 2 (the chain's head) loses its sshd after the controller connected: the first
    host feeds host 3 instead, and host 2 is named with ssh's cause, not as a node that
    merely got nothing."""
    hosts, _ = repair(lab6, dataset, stopped=2)
    want = lab6.tree_digest(lab6.host_path(1, dataset))
    for i in ALL[2:]:
        assert lab6.tree_digest(lab6.host_path(i, dataset)) == want, f"host {i}"
        assert hosts[lab6.address(i)][2] is None, hosts
    _, _, error, fix = hosts[lab6.address(2)]
    assert f"host-to-host ssh to {lab6.address(2)} failed" in error, error
    assert f"ssh to {lab6.address(2)} without a password" in fix, fix
    lab6.assert_no_relay_left(ALL)
