"""The host registry as another user of the host meets it: who holds the host, a refusal
naming them, stale and hostile entries ignored."""
import json
import os
import time

import pytest

from multihost.remote.registry import holds
from multihost.remote.registry import ops as ops_hold
from multihost.remote.proto import OpError

RUN_A = "20261127-110200-ab12"
RUN_B = "20261127-110300-cd34"


@pytest.fixture(autouse=True)
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIHOST_HOLDS_DIR", str(tmp_path / "holds"))
    return tmp_path / "holds"


def claim(run_id, gpus=None, ports=(17000,), name="", allow=False):
    ops_hold.claim({"run_id": run_id, "allow_concurrent": allow,
                    "hold": {"name": name, "controller": "alice@ctl", "gpus": gpus,
                             "ports": list(ports), "hosts": ["h1", "h2"]}})


def test_a_second_run_is_refused_with_the_holder_named(registry):
    claim(RUN_A, gpus=list(range(8)), name="bert-large")
    assert oct(registry.stat().st_mode & 0o7777) == "0o1777"
    with pytest.raises(OpError) as refused:
        claim(RUN_B, gpus=[0], ports=(18000,))
    me = holds.me()["user"]
    assert str(refused.value).startswith(f'busy: {me}\'s run "bert-large" (run {RUN_A}, since 0s, GPUs 0-7)')
    assert "--queue" in refused.value.fix and "multihost stop bert-large" in refused.value.fix
    assert "kill" not in refused.value.fix


def test_runs_on_other_gpus_and_ports_share_the_host():
    claim(RUN_A, gpus=[0, 1, 2, 3])
    claim(RUN_B, gpus=[4, 5, 6, 7], ports=(18000,))
    assert {e["run_id"] for e in holds.read_all() if e["live"]} == {RUN_A, RUN_B}


def test_an_ended_run_no_longer_holds_but_stays_listed(registry):
    claim(RUN_A)
    holds.update(RUN_A, state="succeeded", exit_code=0, ended=time.time())
    claim(RUN_B)  # not refused
    by_id = {e["run_id"]: e for e in holds.read_all()}
    assert by_id[RUN_A]["exit_code"] == 0 and not by_id[RUN_A]["live"]


def test_a_hold_whose_supervisor_is_gone_is_stale():
    claim(RUN_A)
    holds.update(RUN_A, pid=2 ** 22 - 1, ticks=1)
    claim(RUN_B)


def test_hostile_files_are_skipped_and_an_entry_can_not_claim_another_user(registry, tmp_path):
    claim(RUN_A)
    (registry / "run-0-junk.json").write_text("{" * 100000)
    (registry / "queue-0-x.json").write_text(json.dumps({"kind": "queue", "run_id": "../../etc"}))
    # A link to a file of someone else's (a decoy here: the tests run as root, and a
    # write through a link to /etc/passwd would take the machine's users with it).
    decoy = tmp_path / "passwd"
    decoy.write_text("root:x:0:0:root:/root:/bin/bash\n")
    os.symlink(decoy, registry / f"run-0-{RUN_B}.json")
    forged = json.dumps({"kind": "run", "run_id": RUN_B, "user": "alice", "uid": 4242,
                         "gpus": "all", "time": time.time(), "name": 7})
    (registry / f"run-4242-{RUN_B}.json").write_text(forged)
    entries = {e["run_id"]: e for e in holds.read_all()}
    assert set(entries) == {RUN_A, RUN_B}
    assert entries[RUN_B]["uid"] == os.getuid() and entries[RUN_B]["user"] != "alice"
    assert entries[RUN_B]["gpus"] is None and entries[RUN_B]["name"] == ""
    assert decoy.read_text() == "root:x:0:0:root:/root:/bin/bash\n"


def test_a_queue_entry_keeps_its_place_while_refreshed_and_leaves_clean(registry):
    first = ops_hold.hold_queue({"run_id": RUN_A, "queue": {"asked": 100.0, "hosts": ["h1"]}})
    again = ops_hold.hold_queue({"run_id": RUN_A, "queue": {"asked": 200.0, "hosts": ["h1"]}})
    assert [e["time"] for e in again["entries"]] == [100.0] and first["entries"][0]["live"]
    ops_hold.hold_queue({"run_id": RUN_A, "leave": True})
    assert os.listdir(registry) == []


def test_a_registry_kept_locked_by_someone_refuses_in_bounded_time(registry, monkeypatch):
    import subprocess
    import sys

    claim(RUN_A)  # makes the directory
    monkeypatch.setattr(holds, "LOCK_WAIT", 0.3)
    keeper = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)"),
        str(registry)], stdout=subprocess.PIPE, text=True)
    try:
        assert keeper.stdout.readline().strip() == "held"
        began = time.monotonic()
        with pytest.raises(OpError, match="stayed locked"):
            claim(RUN_B)
        assert time.monotonic() - began < 5
    finally:
        keeper.kill()
        keeper.wait()
