"""Fixtures shared by the unit tests."""
import os
import signal
import sys

import pytest

from multihost.fanout import HostGroup
from multihost.hosts import Host
from multihost.sync.pipeline import sync_code


@pytest.fixture(autouse=True)
def host_registry(tmp_path_factory, monkeypatch):
    """Every test's runs on this machine have a host registry of their own: tests (and
    the people running them) at the same time must not see each other's runs as busy."""
    monkeypatch.setenv("MULTIHOST_HOLDS_DIR", str(tmp_path_factory.mktemp("holds")))


@pytest.fixture(autouse=True)
def pipe_signal():
    """`multihost logs` called in this process (cli.main) lets a closed pipe end it, as a
    command meant for `| head` should; the next test must get Python's default back, or
    a test of a broken stream would end pytest itself."""
    before = signal.getsignal(signal.SIGPIPE)
    yield
    signal.signal(signal.SIGPIPE, before)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A code directory and two "hosts" that are local transports (127.0.0.1 and
    localhost) with their own workdirs: ``env.sync(**kw)`` syncs one to the others."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print('train')\n")
    (code / "pkg" / "__init__.py").write_text("")
    (code / "pkg" / "model.py").write_text("LAYERS = 4\n")
    (code / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(code / "run.sh", 0o755)
    os.symlink("pkg/model.py", code / "model_link.py")
    os.symlink("/data/coco", code / "dataset")       # out of the tree: kept as a link
    hosts = (Host(name="127.0.0.1", rank=0, python=sys.executable),
             Host(name="localhost", rank=1, python=sys.executable))
    workdirs = {0: str(tmp_path / "w0"), 1: str(tmp_path / "w1")}

    class Env:
        pass

    e = Env()
    e.code, e.hosts, e.workdirs, e.tmp = code, hosts, workdirs, tmp_path
    e.sync = lambda **kw: _sync(e, **kw)
    return e


def _sync(e, **kw):
    with HostGroup(e.hosts) as cluster:
        return sync_code(cluster, str(e.code), workdirs=e.workdirs, **kw)


@pytest.hookimpl(tryfirst=True)   # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    # With workers (scripts/test.sh: -n 2 --dist loadgroup) the unit tests run one after
    # another on one worker, beside the lab tests (which mostly wait) on the other.
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if os.path.abspath(str(item.fspath)).startswith(here + os.sep):
            item.add_marker(pytest.mark.xdist_group("unit"))
