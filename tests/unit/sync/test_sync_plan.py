"""Pure parts of the sync planner: what a host needs from its plan reply, how files are
grouped for relays, and how a host reaches another with its own ssh."""
import json
import shlex

from multihost import helper

from multihost.hosts import Host
from multihost.sync.model import needs_from_plan
from multihost.sync.ignore import IgnoreRules
from multihost.sync.manifest import Entry, Manifest
from multihost.sync.transfer import group_for_relay, hop_spec

MB = 1 << 20


def manifest(tmp_path, entries, ignore=""):
    (tmp_path / ".multihostignore").write_text(ignore)
    rules = IgnoreRules(str(tmp_path))
    rules.enter("", str(tmp_path))
    return Manifest(str(tmp_path), tuple(entries), rules)


def f(path, size=10):
    return Entry(path, "f", size, 0o644, 1, "h")


def test_needs_from_plan_deletes_only_what_a_sync_put_there_and_is_not_ignored(tmp_path):
    m = manifest(tmp_path, [Entry("pkg", "d", 0, 0o755, 0, ""), f("pkg/a.py"), f("b.py")],
                 ignore="*.ckpt\n")
    plan = {"root": "/w", "add": [1], "change": [2], "meta": [], "retype": [],
            "gone": ["old/", "old/x.py", "model.ckpt"]}
    needs = needs_from_plan(m, 0, plan)
    assert needs.deletes == ("old/x.py", "old")          # deepest first; the ckpt is ignored
    assert [e.path for e in needs.send] == ["b.py", "pkg/a.py"]
    assert needs.added == ("pkg/a.py",) and needs.changed == ("b.py",)
    assert needs.tracked == ("b.py", "pkg/", "pkg/a.py")


def test_heavy_files_needed_by_several_hosts_go_by_relay_the_rest_directly():
    big, small, only2 = f("w.bin", 300 * MB), f("a.py"), f("extra.bin", 100 * MB)
    candidates = {0: [big, small], 1: [big, small, only2], 2: [big, small], 3: [small]}
    relays, direct = group_for_relay(candidates, relayable=[0, 1, 2, 3])
    # a.py is needed by another set of hosts (all four) and weighs too little to relay.
    assert [(g.ranks, [e.path for e in g.entries]) for g in relays] == [((0, 1, 2), ["w.bin"])]
    assert direct == {0: [small], 1: [small, only2], 2: [small], 3: [small]}


def test_light_groups_and_local_hosts_do_not_relay():
    small = f("a.py", MB)
    relays, direct = group_for_relay({0: [small], 1: [small]}, relayable=[0, 1])
    assert relays == [] and direct == {0: [small], 1: [small]}
    big = f("w.bin", 300 * MB)
    relays, _ = group_for_relay({0: [big], 1: [big]}, relayable=[1])
    assert relays == []


class Transport2:
    def __init__(self, host):
        self.host = host


def test_a_hop_uses_the_address_the_controller_reached_and_quotes_the_python():
    class Target:
        hostname, port, user = "10.0.0.7", 2222, "ubuntu"

    class Transport:
        target = Target()

    host = Host(name="gpu7", rank=6, python="/opt/my python/bin/python3")
    hop = hop_spec(host, Transport(), "/home/ubuntu/work")
    assert hop["ssh"][-2:] == ["--", "10.0.0.7"]
    assert hop["ssh"][hop["ssh"].index("-p") + 1] == "2222" and "ubuntu" in hop["ssh"]
    assert "BatchMode=yes" in hop["ssh"]
    assert hop["root"] == "/home/ubuntu/work" and hop["rank"] == 6
    # The relay appends the quoted request: the result is exactly the helper's own line.
    request = {"hops": [hop], "index": 0}
    line = hop["line"] + " " + shlex.quote(json.dumps(request, separators=(",", ":")))
    assert line == helper.helper_command(Transport2(host), "sync.receive", request)
    assert "'/opt/my python/bin/python3'" in line
