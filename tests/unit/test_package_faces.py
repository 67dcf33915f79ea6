"""Each feature package's ``__init__`` is its public face: the names other packages use,
loaded on first use, so that importing a package stays cheap for the CLI's start-up."""
import importlib
import subprocess
import sys

import pytest

PACKAGES = ["check", "sync", "data", "run", "logs", "scale"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_of_a_face_is_the_one_its_module_defines(package):
    face = importlib.import_module(f"multihost.{package}")
    assert face.__all__, f"multihost.{package} names nothing"
    for name in face.__all__:
        module = importlib.import_module(f"multihost.{package}.{face._LAZY[name]}")
        assert getattr(face, name) is getattr(module, name)
    assert set(face.__all__) <= set(dir(face))
    with pytest.raises(AttributeError):
        face.no_such_name


def loaded_after(statement: str):
    """The multihost modules a fresh interpreter has loaded after ``statement``."""
    code = f"{statement}\nimport sys\nprint(' '.join(m for m in sys.modules if m.startswith('multihost')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_importing_a_package_loads_none_of_its_modules():
    loaded = loaded_after("import multihost.check, multihost.sync, multihost.data, "
                          "multihost.run, multihost.logs")
    assert not {m for m in loaded if m.count(".") >= 2}, loaded


def test_asking_for_the_sync_entry_point_leaves_the_delivery_engine_unloaded():
    # a sync that finds nothing to do never needs its sessions, delivery or relays
    loaded = loaded_after("from multihost.sync import sync_code")
    assert "multihost.sync.pipeline" in loaded
    assert not loaded & {"multihost.sync.deliver", "multihost.sync.session",
                         "multihost.sync.bulk", "multihost.data.verify"}, loaded


def test_a_sync_creates_at_start_up_only_the_records_a_sync_uses():
    # Creating a frozen dataclass costs 1-2 ms at every start: `multihost sync` must not
    # pay for a run's events or the spares' records (a no-change sync is mostly start-up).
    code = (
        "import dataclasses\n"
        "made = []\n"
        "real = dataclasses._process_class\n"
        "dataclasses._process_class = lambda cls, *a, **k: made.append(cls.__name__) or real(cls, *a, **k)\n"
        "from multihost.cli import build_parser\n"
        "from multihost.commands.common import hosts_from_args\n"
        "from multihost.job import job_options_from_args\n"
        "from multihost.sync.pipeline import sync_code\n"
        "from multihost.views.sync_view import SyncView\n"
        "args = build_parser('sync').parse_args(['sync', '--ips', '10.0.0.1,10.0.0.2'])\n"
        "hosts_from_args(args), job_options_from_args(args)\n"
        "print(' '.join(made))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    made = set(done.stdout.split())
    assert {"Host", "SshOptions"} <= made, made
    # The sync's own records come once its hosts' checks have started, not before.
    assert not made & {"SyncPlanned", "SyncHostDone", "HostSync", "Entry", "Manifest"}, made
    assert not made & {"RunStarted", "NodeChanged", "LogLine", "LogBlock", "RootCause",
                       "RunFinished", "GpuSample", "CheckStage", "Replacement", "SpareState"}, made
