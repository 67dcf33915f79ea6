"""Data verification: the comparison (pure), the one-line error, and verify_data on two
local "hosts" whose copies of a relative dataset path live in different workdirs."""
import os
import sys

import pytest

from multihost.data.verify import (DataReport, HostData, PathDiff, compare_listings, data_error,
                            verify_data)
from multihost.fanout import HostGroup
from multihost.hosts import Host


def entry(path, content_hash, size=10):
    return [path, "f", size, content_hash, 0o644, 1]


def test_compare_lists_missing_extra_and_differing_first_few_then_counts():
    ref = [entry(f"img/{i:03}.jpg", "h") for i in range(20)] + [entry("labels.txt", "a")]
    mine = [entry(f"img/{i:03}.jpg", "h") for i in range(10, 20)] + [entry("labels.txt", "b"),
                                                                    entry("junk.tmp", "c")]
    diff = compare_listings("/data/coco", "h1", ref, mine)
    assert diff.counts == (10, 1, 1)
    assert diff.missing == ("img/000.jpg", "img/001.jpg", "img/002.jpg", "img/003.jpg", "img/004.jpg")
    assert diff.extra == ("junk.tmp",) and diff.differing == ("labels.txt",)


def test_same_name_same_hash_but_link_versus_file_differs():
    ref = [["a", "l", 0, "target", 0, 0]]
    mine = [["a", "f", 6, "target", 0o644, 1]]
    assert compare_listings("/d", "h1", ref, mine).counts == (0, 0, 1)


def report_with(*hosts, odd=()):
    return DataReport(("/data/coco",), tuple(hosts), tuple(odd))


def test_error_names_the_host_the_files_and_the_repair():
    bad = HostData("10.0.0.2", 1, (), (PathDiff("/data/coco", "10.0.0.1", missing=("a.jpg",),
                                                 counts=(1, 0, 0)),))
    good = HostData("10.0.0.1", 0, (), (PathDiff("/data/coco", "10.0.0.1"),))
    err = data_error(report_with(good, bad))
    assert err.host == "10.0.0.2" and "1 missing (a.jpg)" in err.cause
    assert "--data /data/coco --sync-data" in err.fix and err.exit_code == 4


def test_error_when_the_first_host_is_the_odd_one_out_says_not_to_copy_from_it():
    diff = PathDiff("/data/coco", "10.0.0.1", differing=("x",), counts=(0, 0, 1))
    hosts = [HostData("10.0.0.1", 0, (), (PathDiff("/data/coco", "10.0.0.1"),))] + [
        HostData(f"10.0.0.{i}", i - 1, (), (diff,)) for i in (2, 3)]
    err = data_error(report_with(*hosts, odd=("/data/coco",)))
    assert "2 of 3 hosts" in err.cause and "differs from all the others" in err.fix


@pytest.fixture
def two_hosts(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for side in ("a", "b"):
        ds = tmp_path / side / "dataset"
        (ds / "train").mkdir(parents=True)
        for i in range(30):
            (ds / "train" / f"{i}.jpg").write_bytes(b"image %d" % i)
        (ds / "labels.txt").write_text("cat\ndog\n")
    hosts = (Host(name="127.0.0.1", rank=0, python=sys.executable),
             Host(name="localhost", rank=1, python=sys.executable))
    workdirs = {0: str(tmp_path / "a"), 1: str(tmp_path / "b")}
    return tmp_path, hosts, workdirs


def verify(hosts, workdirs, *paths):
    with HostGroup(hosts) as cluster:
        return verify_data(cluster, paths, workdirs=workdirs)


def test_identical_copies_pass_and_a_second_check_reads_nothing(two_hosts):
    tmp, hosts, workdirs = two_hosts
    first = verify(hosts, workdirs, "dataset")
    assert first.ok and first.hosts[0].states[0].files == 31
    again = verify(hosts, workdirs, "dataset")
    assert again.ok and [h.states[0].hashed_bytes for h in again.hosts] == [0, 0]


def test_a_differing_copy_is_listed_with_host_and_file_names(two_hosts):
    tmp, hosts, workdirs = two_hosts
    (tmp / "b" / "dataset" / "train" / "7.jpg").write_bytes(b"corrupt")
    os.remove(tmp / "b" / "dataset" / "train" / "9.jpg")
    (tmp / "b" / "dataset" / "extra.jpg").write_bytes(b"x")
    report = verify(hosts, workdirs, "dataset")
    assert not report.ok and report.hosts[0].ok
    diff = report.hosts[1].diffs[0]
    assert (diff.missing, diff.extra, diff.differing) == (("train/9.jpg",), ("extra.jpg",),
                                                          ("train/7.jpg",))
    assert data_error(report).host == "localhost"


def test_a_missing_path_and_a_single_file_dataset(two_hosts):
    tmp, hosts, workdirs = two_hosts
    (tmp / "a" / "vocab.txt").write_text("a b c\n")
    report = verify(hosts, workdirs, "vocab.txt", "nowhere")
    assert report.hosts[1].diffs[0].absent and report.hosts[0].states[0].files == 1
    assert all(h.diffs[1].absent for h in report.hosts)
    assert "exists on none of the 2 hosts" in data_error(report).cause


def test_a_file_name_with_terminal_escapes_is_listed_without_them(two_hosts):
    tmp, hosts, workdirs = two_hosts
    (tmp / "b" / "dataset" / "evil\x1b]52;c;aGk=\x07\x1b[2J.jpg").write_bytes(b"x")
    report = verify(hosts, workdirs, "dataset")
    (extra,) = report.hosts[1].diffs[0].extra
    assert extra.startswith("evil") and extra.endswith(".jpg")
    assert not any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 for c in extra), repr(extra)


def test_a_trash_another_account_planted_beside_the_data_takes_nothing(tmp_path, monkeypatch):
    import io
    import json

    from multihost.remote.data.host import trash
    from multihost.remote.proto import OpError

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)                         # like /tmp
    data = shared / "data"
    data.mkdir()
    (data / "old.bin").write_text("x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = shared / ".data.multihost-trash"
    os.symlink(elsewhere, planted)
    os.lchown(planted, 4242, 4242)               # made by another account
    stdin = io.TextIOWrapper(io.BytesIO(json.dumps(["old.bin"]).encode()))
    monkeypatch.setattr(sys, "stdin", stdin)
    with pytest.raises(OpError, match="is a link made by 4242"):
        trash({"root": str(data)})
    assert (data / "old.bin").exists() and list(elsewhere.iterdir()) == []
