"""The host registry as another user of the host meets it: who holds the host, a refusal
naming them, stale and hostile entries ignored."""
import json
import os
import time

import pytest

from multihost.remote.registry import holds, place
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
    assert set(entries) == {RUN_A}     # a file named for uid 4242 that 4242 did not write
    other = "20261127-110400-ee56"
    fd = os.open(registry / f"run-{os.getuid()}-{other}.json",
                 os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(forged.replace(RUN_B, other))
    entries = {e["run_id"]: e for e in holds.read_all()}
    assert entries[other]["uid"] == os.getuid() and entries[other]["user"] != "alice"
    assert entries[other]["gpus"] is None and entries[other]["name"] == ""
    assert decoy.read_text() == "root:x:0:0:root:/root:/bin/bash\n"


def test_a_queue_entry_keeps_its_place_while_refreshed_and_leaves_clean(registry):
    first = ops_hold.hold_queue({"run_id": RUN_A, "queue": {"asked": 100.0, "hosts": ["h1"]}})
    again = ops_hold.hold_queue({"run_id": RUN_A, "queue": {"asked": 200.0, "hosts": ["h1"]}})
    assert [e["time"] for e in again["entries"]] == [100.0] and first["entries"][0]["live"]
    ops_hold.hold_queue({"run_id": RUN_A, "leave": True})
    assert os.listdir(registry) == []


def test_a_registry_kept_locked_by_someone_is_passed_in_bounded_time(registry, monkeypatch):
    import subprocess
    import sys

    claim(RUN_A)  # makes the directory
    monkeypatch.setattr(place, "LOCK_WAIT", 0.3)
    keeper = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)"),
        str(registry)], stdout=subprocess.PIPE, text=True)
    try:
        assert keeper.stdout.readline().strip() == "held"
        began = time.monotonic()
        claim(RUN_B, allow=True)   # advisory: the run goes on, its entry written
        assert time.monotonic() - began < 5
        assert {e["run_id"] for e in holds.read_all()} == {RUN_A, RUN_B}
    finally:
        keeper.kill()
        keeper.wait()


def test_junk_names_never_hide_an_entry_and_an_over_full_registry_is_reported(registry, monkeypatch):
    claim(RUN_A)
    monkeypatch.setattr(holds, "MAX_FILES", 5)
    for i in range(20):                         # sorted before every entry's name
        (registry / f"a{i:04d}").write_text("")
    assert [e["run_id"] for e in holds.read_all()] == [RUN_A]
    for i in range(6):                          # names of entries, all of one user
        (registry / f"run-4242-20261127-1100{i:02d}-ffff.json").write_text("{}")
    entries, trouble = holds.scan()
    assert [e["run_id"] for e in entries] == [RUN_A]
    assert trouble and "holds 6 entries of 4242: only 5 were read" in trouble[0]["text"]


def test_forged_times_pids_and_names_are_tamed(registry):
    claim(RUN_A)
    path = registry / f"run-{os.getuid()}-{RUN_B}.json"
    path.write_text(json.dumps({"kind": "run", "run_id": RUN_B, "pid": 1, "ticks": 0,
                                "name": "x\nroot  20261127-110200-ab12  running",
                                "time": time.time() + 10 ** 9}))
    queue = registry / f"queue-{os.getuid()}-{RUN_B}.json"
    queue.write_text(json.dumps({"kind": "queue", "run_id": RUN_B, "seen": time.time() + 10 ** 9,
                                 "time": time.time() + 10 ** 9}))
    entries = {(e["kind"], e["run_id"]): e for e in holds.read_all()}
    run, waiting = entries[("run", RUN_B)], entries[("queue", RUN_B)]
    assert run["name"] == "" and run["time"] <= time.time()   # not a name a run can have
    assert not run["live"]                       # pid 1 is not this entry's process
    assert waiting["seen"] <= time.time() and waiting["time"] <= time.time()


def test_a_registry_not_made_by_root_is_not_used_and_a_run_goes_on(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    registry.mkdir()
    os.chown(registry, 4242, 4242)
    registry.chmod(0o1777)
    claim(RUN_A)
    assert os.listdir(registry) == []            # nothing of ours in her directory
    entries, trouble = holds.scan()
    assert [e["run_id"] for e in entries] == [RUN_A]
    assert "is a directory of 4242 (mode 1777), not root's: not used" in trouble[0]["text"]
    assert f"`rm -rf {registry} && mkdir -m 1777 {registry}`" in trouble[0]["fix"]
    assert "chmod" not in trouble[0]["fix"]
    with pytest.raises(OpError, match="busy: "):
        claim(RUN_B)  # our own run A, seen in the fallback, still holds the host
