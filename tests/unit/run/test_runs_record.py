"""The controller's record of runs: ids, private files, the last run, ids by prefix, and
reconnecting to a run's hosts from the record alone."""
from __future__ import annotations

import re
import stat

import pytest

from multihost.run import records as runs
from multihost.errors import ConfigError
from multihost.hosts import Host


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def record(run_id: str, **changes) -> runs.RunRecord:
    hosts = [Host("10.0.0.1", rank=0, user="ubuntu", port=2222, identity_file="~/.ssh/k",
                  workdir="/data/job", python="/opt/py/bin/python", gpus=(0, 1), iface="ens5",
                  data=("/data/coco",)),
             Host("gpu-b", rank=1)]
    nodes = tuple(runs.NodeRecord(h.rank, runs.host_to_dict(h), h.label, f"10.0.0.{h.rank + 1}",
                                  2, 2 * h.rank) for h in hosts)
    fields = dict(run_id=run_id, created=1.0, nodes=nodes, command=("train.py", "--token=***"),
                  launcher="torchrun", node0_argv="python -m torch.distributed.run ...",
                  log_dir="/tmp/log/" + run_id)
    fields.update(changes)
    return runs.RunRecord(**fields)


def test_run_ids_sort_by_time_and_are_printable():
    first = runs.new_run_id(now=1_700_000_000)
    second = runs.new_run_id(now=1_700_000_001)
    assert re.fullmatch(r"20231114-221320-[0-9a-f]{4}", first)
    assert runs.RUN_ID_RE.match(second) and first < second


def test_saved_record_is_private_and_round_trips_every_host_field(home):
    original = record("20250101-120000-ab12", state="running")
    path = runs.save_run(original, make_last=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / ".multihost").stat().st_mode) == 0o700
    loaded = runs.load_run(None)                    # the last run
    assert loaded == original
    assert loaded.hosts[0] == Host("10.0.0.1", rank=0, user="ubuntu", port=2222,
                                   identity_file="~/.ssh/k", workdir="/data/job",
                                   python="/opt/py/bin/python", gpus=(0, 1), iface="ens5",
                                   data=("/data/coco",))
    assert loaded.nprocs == (2, 2) and str(loaded.mirror_dir) == "/tmp/log/20250101-120000-ab12"


def test_state_left_open_by_an_older_version_is_closed_again(home):
    (home / ".multihost" / "runs").mkdir(parents=True)
    for directory in (home / ".multihost", home / ".multihost" / "runs"):
        directory.chmod(0o755)
    runs.save_run(record("20250101-120000-ab12"))
    for directory in (home / ".multihost", home / ".multihost" / "runs"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory


def test_runs_by_prefix_and_the_errors_that_name_the_fix():
    with pytest.raises(ConfigError, match="no run has been started"):
        runs.load_run(None)
    for run_id in ("20250101-120000-ab12", "20250101-120500-cd34", "20250102-080000-ef56"):
        runs.save_run(record(run_id))
    assert runs.load_run("20250102").run_id == "20250102-080000-ef56"
    with pytest.raises(ConfigError, match="matches 2 runs") as err:
        runs.load_run("20250101")
    assert "more of the run id" in err.value.fix
    with pytest.raises(ConfigError, match="no run '2024'") as err:
        runs.load_run("2024")
    assert "status --list" in err.value.fix
    assert [r.run_id for r in runs.list_runs()] == [
        "20250102-080000-ef56", "20250101-120500-cd34", "20250101-120000-ab12"]


def test_a_corrupt_record_is_a_clear_error(home):
    runs.save_run(record("20250101-120000-ab12"), make_last=True)
    runs.record_path("20250101-120000-ab12").write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        runs.load_run(None)
    assert runs.list_runs() == []


def test_with_node_changes_one_node_only():
    base = record("20250101-120000-ab12")
    changed = base.with_node(1, state="failed", exit_code=3)
    assert (changed.nodes[1].state, changed.nodes[1].exit_code) == ("failed", 3)
    assert changed.nodes[0] == base.nodes[0]


def test_a_failed_runs_state_and_root_cause_come_back_typed_from_its_record():
    """status, stop and logs all read the root cause the run wrote: one codec, both ways."""
    from multihost.events import RootCause, RunState

    cause = RootCause("gpu-b", 1, 3, 3, "exit 3", ("ValueError: bad batch",), local_rank=1)
    runs.save_run(record("20250101-120000-ab12", state=RunState.FAILED, exit_code=3,
                         root_cause=cause))
    loaded = runs.load_run("20250101")
    assert loaded.state is RunState.FAILED and loaded.finished
    assert loaded.root_cause == cause
    assert f"{loaded.state}" == "failed"         # messages show the word, as before
