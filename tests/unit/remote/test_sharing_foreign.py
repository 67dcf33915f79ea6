"""The host-side probe that names trainings multihost did not start: a launcher found by
its argv, with its user and the processes below it; a run of the registry is not one."""
import os
import subprocess
import sys
import time

from multihost.remote.registry import holds
from multihost.remote.run import processes as run_processes
from multihost.remote.check import proc as ops_check_proc
from multihost.remote.registry import ops as ops_hold


def launcher(tmp_path, name="torchrun", wait=10.0):
    script = tmp_path / name
    script.write_text("import subprocess, sys, time\n"
                      "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                      "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        found = [f for f in ops_check_proc.foreign_facts({}) if f["pid"] == proc.pid]
        if found and found[0]["tree"]:
            return proc, found[0]
        time.sleep(0.05)
    return proc, None


def stop(proc):
    for pid in [proc.pid] + [int(p) for p in os.listdir("/proc") if p.isdigit()
                             and run_processes._stat(int(p))
                             and run_processes._stat(int(p))[1] == proc.pid]:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    proc.wait()


def test_a_hand_started_torchrun_is_named_with_its_user_and_children(tmp_path):
    proc, found = launcher(tmp_path)
    try:
        assert found is not None
        assert found["uid"] == os.getuid() and found["user"]
        assert found["command"].endswith(f"{tmp_path}/torchrun")
        assert len(found["tree"]) == 1                      # its worker, not named apart
        assert not [f for f in ops_check_proc.foreign_facts({}) if f["pid"] in found["tree"]]
    finally:
        stop(proc)


def test_a_process_that_only_looks_like_training_is_not_named(tmp_path):
    proc, found = launcher(tmp_path, name="train.py", wait=2.0)
    try:
        assert found is None
    finally:
        stop(proc)


def test_the_processes_of_a_run_in_the_registry_are_not_foreign(tmp_path):
    proc, found = launcher(tmp_path)
    try:
        assert found is not None
        run_id = "20261127-110200-ab12"
        ops_hold.claim({"run_id": run_id, "hold": {}})
        holds.update(run_id, pid=os.getpid(), ticks=run_processes.start_ticks(os.getpid()))   # its supervisor: our pytest
        assert not [f for f in ops_check_proc.foreign_facts({}) if f["pid"] == proc.pid]
    finally:
        stop(proc)
