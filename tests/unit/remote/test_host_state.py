"""Hosts that share one home directory (NFS homes) keep their own state apart: the
first host to use ~/.multihost keeps it there, every other one below hosts/<name>."""
from __future__ import annotations

import os
import threading

import pytest

from multihost.remote import machine
from multihost.remote.run import files as run_files

RUN = "20260101-120000-ab12"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(machine, "_dirs", {})
    return tmp_path


def as_host(monkeypatch, name):
    """The helper as it runs on host ``name`` (a new process there: nothing remembered)."""
    monkeypatch.setattr(machine, "_dirs", {})
    monkeypatch.setattr(machine, "host_name", lambda: name)


def test_a_home_of_its_own_keeps_the_usual_layout(home, monkeypatch):
    as_host(monkeypatch, "gpu1-aaaa")
    assert run_files.run_dir(RUN) == str(home / ".multihost" / "runs" / RUN)
    assert run_files.root_dir(make=True) == str(home / ".multihost")
    as_host(monkeypatch, "gpu1-aaaa")   # the next call on that host: the same place
    assert run_files.root_dir() == str(home / ".multihost")


def test_hosts_sharing_a_home_each_get_their_own_run_directory(home, monkeypatch):
    seen = {}
    for name in ("gpu1-aaaa", "gpu2-bbbb", "gpu3-cccc", "gpu1-aaaa"):
        as_host(monkeypatch, name)
        run_files.root_dir(make=True)
        seen.setdefault(name, run_files.run_dir(RUN))
        assert run_files.run_dir(RUN) == seen[name]
    assert len(set(seen.values())) == 3
    assert seen["gpu1-aaaa"] == str(home / ".multihost" / "runs" / RUN)
    assert seen["gpu2-bbbb"] == str(home / ".multihost" / "hosts" / "gpu2-bbbb" / "runs" / RUN)


def test_a_reader_makes_nothing_where_nothing_is(home, monkeypatch):
    as_host(monkeypatch, "gpu1-aaaa")
    run_files.root_dir()
    assert not (home / ".multihost").exists()


def test_hosts_claiming_at_once_agree_on_one_owner(home, monkeypatch):
    base = str(home / ".multihost")
    os.makedirs(base)
    owners, start = [], threading.Barrier(8)

    def claim(i):
        start.wait()
        owners.append(machine._claim(base, os.path.join(base, machine.OWNER), f"h{i}"))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(owners)) == 1 and owners[0].startswith("h")


def test_the_host_name_tells_apart_hosts_of_one_image(monkeypatch):
    name = machine.host_name()
    assert name.startswith(os.uname()[1])
