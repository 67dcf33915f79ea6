"""A workdir several hosts share is written by one host and checked from one other; the
rest of its hosts are counted as verified by that check (sync/shared.py)."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from multihost.errors import SyncError
from multihost.sync.model import HostSync, SharedWorkdir, SyncReport, sync_error
from multihost.sync.shared import Sharing, checkers_of, one_writer_each
from multihost.views.sync_view import sync_lines


@dataclass(frozen=True)
class FakeHost:
    rank: int
    label: str


class FakeCluster:
    def __init__(self, hosts):
        self.hosts = tuple(hosts)

    def subset(self, hosts):
        return FakeCluster(hosts)

    def leave_connection(self, host):
        LEFT.append(host.rank)


LEFT = []


def cluster_of(n):
    return FakeCluster(FakeHost(r, f"h{r + 1}") for r in range(n))


def syncing(fail=()):
    """A sync_part that records which hosts it synced, and with which writers."""
    calls = []

    def sync_part(part, writers):
        calls.append(([h.rank for h in part.hosts], dict(writers)))
        hosts = tuple(HostSync(h.label, h.rank, "/home/u/proj",
                               error="unreachable" if h.rank in fail else None,
                               files=0 if writers else 3) for h in part.hosts)
        report = SyncReport("/code", 3, 30, hosts)
        if not report.ok:
            raise sync_error(report)
        return report
    return sync_part, calls


def test_a_group_is_checked_from_its_second_host_only():
    assert checkers_of(((0, 1, 2, 3),), {r: "~/proj" for r in range(4)}) == {1: 1, 2: 1, 3: 1}


def test_a_host_naming_the_directory_by_another_path_checks_it_itself():
    workdirs = {0: "~/proj", 1: "~/proj", 2: "/nfs/u/proj", 3: "~/proj"}
    assert checkers_of(((0, 1, 2, 3),), workdirs) == {1: 1, 2: 2, 3: 1}


def test_each_group_gets_its_own_checker():
    workdirs = {r: "~/proj" for r in range(6)}
    assert checkers_of(((0, 2, 4), (1, 3, 5)), workdirs) == {2: 2, 4: 2, 3: 3, 5: 3}


def test_64_hosts_sharing_a_workdir_write_once_check_once_and_say_so():
    cluster = cluster_of(64)
    sync_part, calls = syncing()
    adopted = []
    report = one_writer_each(cluster, lambda: Sharing((tuple(range(64)),)), {r: "~/proj" for r in range(64)},
                             sync_part, lambda rank, by: adopted.append((rank, by)))
    assert calls == [([0], {}), ([1], {1: "h1"})]
    assert sorted(adopted) == [(r, 1) for r in range(2, 64)]
    assert report.ok and len(report.hosts) == 64
    assert report.hosts[5].notes == ("shares the workdir of h1: written there once, checked from h2",)
    assert report.shared == (SharedWorkdir("/home/u/proj", tuple(f"h{r}" for r in range(1, 65)),
                                           "h1", ("h2",)),)
    lines = sync_lines(report)
    assert "64 hosts share /home/u/proj: written once by h1, checked from h2" in lines
    assert "h6: up to date (shares the workdir of h1: written there once, checked from h2)" in lines


def test_a_counted_host_the_probe_reached_without_a_master_is_left_one():
    LEFT.clear()
    sync_part, _ = syncing()
    one_writer_each(cluster_of(5), lambda: Sharing(((0, 1, 2, 3, 4),), unmastered=(0, 1, 3)),
                    {r: "~/proj" for r in range(5)}, sync_part)
    # 0 and 1 were written and checked (their sync leaves theirs); 2 and 4 have one
    assert LEFT == [3]


def test_when_the_check_fails_every_other_host_of_the_group_checks_itself():
    cluster = cluster_of(4)
    sync_part, calls = syncing(fail={1})
    adopted = []
    with pytest.raises(SyncError) as caught:
        one_writer_each(cluster, lambda: Sharing(((0, 1, 2, 3),)), {r: "~/proj" for r in range(4)},
                        sync_part, lambda rank, by: adopted.append(rank))
    assert calls[1:] == [([1], {1: "h1"}), ([2, 3], {2: "h1", 3: "h1"})]
    assert adopted == []
    report = caught.value.report
    assert [h.ok for h in report.hosts] == [True, False, True, True]
    assert report.shared[0].checkers == ("h2", "h3", "h4")


def test_the_first_host_is_written_beside_the_probe():
    cluster = cluster_of(3)
    sync_part, calls = syncing()
    head_began = threading.Event()

    def part(hosts, writers):
        if [h.rank for h in hosts.hosts] == [0]:
            head_began.set()
        return sync_part(hosts, writers)

    def probe():
        assert head_began.wait(60), "the probe ran before the first host's sync began"
        return Sharing(((0, 1, 2),))
    report = one_writer_each(cluster, probe, {r: "~/proj" for r in range(3)}, part)
    assert calls == [([0], {}), ([1], {1: "h1"})] and report.ok


def test_a_tree_heavy_enough_for_relays_is_written_after_the_probe_in_one_part():
    cluster = cluster_of(4)
    sync_part, calls = syncing()
    probed = []
    report = one_writer_each(cluster, lambda: probed.append(list(calls)) or Sharing(((2, 3),)),
                             {r: "~/proj" for r in range(4)}, sync_part, early=False)
    assert probed == [[]]                          # nothing written before the probe answered
    assert calls == [([0, 1, 2], {}), ([3], {3: "h3"})] and report.ok


def test_a_failing_probe_leaves_no_sync_behind():
    cluster = cluster_of(3)
    sync_part, calls = syncing()

    def probe():
        raise SyncError("cannot ask", host="h2")
    with pytest.raises(SyncError):
        one_writer_each(cluster, probe, {r: "~/proj" for r in range(3)}, sync_part)
    assert calls == [([0], {})]


def test_hosts_with_workdirs_of_their_own_are_synced_first_with_the_writers():
    cluster = cluster_of(4)
    sync_part, calls = syncing()
    report = one_writer_each(cluster, lambda: Sharing(((1, 2, 3),)), {r: "~/proj" for r in range(4)},
                             sync_part)
    # the first host beside the probe, then the other writers, then one checker
    assert sorted(calls[:2]) == [([0], {}), ([1], {})] and calls[2:] == [([2], {2: "h2"})]
    assert [h.files for h in report.hosts] == [3, 3, 0, 0]
    assert report.hosts[3].notes == ("shares the workdir of h2: written there once, checked from h3",)


def test_a_counted_host_takes_the_checkers_record_for_its_next_no_change_sync(tmp_path, monkeypatch):
    from multihost.sync.fastpath import adopt_record, load_record, record_keys, save_record
    from multihost.sync.manifest import build_manifest

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    manifest = build_manifest(str(code))
    keys = {wire[0]: [33188, 9, 1, 2, 77] for wire in manifest.wires()}
    assert save_record("h2", "~/proj", str(code), "/home/u/proj", manifest, keys)
    assert load_record("h3", "~/proj", str(code)) is None
    adopt_record("h2", "h3", "~/proj", str(code))
    record = load_record("h3", "~/proj", str(code))
    assert record["root"] == "/home/u/proj" and record["stat"] is None
    assert record_keys(record) == [keys[w[0]] for w in manifest.wires()]


def test_a_host_whose_workdir_was_shared_last_time_is_expected_to_share_one_beside_it(
        tmp_path, monkeypatch):
    from multihost.sync.shared import remember_shared, shared_before

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert not shared_before("h1", "~/multihost/a")
    remember_shared("h1", "~/multihost/a", True)
    assert shared_before("h1", "~/multihost/b")          # another project in the same home
    assert not shared_before("h2", "~/multihost/b")
    assert not shared_before("h1", "/scratch/b")
    remember_shared("h1", "~/multihost/b", False)        # the probe found it on its own
    assert not shared_before("h1", "~/multihost/a")


def test_a_code_directory_that_is_not_there_is_refused_before_any_host_is_asked(
        tmp_path, monkeypatch):
    """Even where the first host is written beside the probe (its workdir was shared last
    time), a wrong --code makes no workdir on any host."""
    from multihost.errors import ConfigError
    from multihost.fanout import HostGroup
    from multihost.hosts import Host
    from multihost.sync.pipeline import sync_code
    from multihost.sync.shared import remember_shared

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    remember_shared("gpu1", "~/multihost/proj", True)
    asked = []
    monkeypatch.setattr(HostGroup, "reused", lambda self, host: asked.append(host) or None)
    monkeypatch.setattr(HostGroup, "transport", lambda self, host: asked.append(host))
    cluster = HostGroup([Host(name="gpu1"), Host(name="gpu2", rank=1)])
    with pytest.raises(ConfigError, match="does not exist or is not a directory"):
        sync_code(cluster, str(tmp_path / "no-such-dir"),
                  workdirs={0: "~/multihost/proj", 1: "~/multihost/proj"})
    assert asked == []
