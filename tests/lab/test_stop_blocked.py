"""A stop whose ranks are stuck in a collective that no peer joins (as PyTorch
Lightning's SIGTERM handler broadcasts while its peers wait elsewhere): each host kills
them once every rank left is blocked, says so, and leaves nothing; a process that ignores
SIGTERM keeps the kill wait, and the screen says what the stop waits for."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from test_run import hostfile, leftovers, run_started_by, status_json, wait_running

pytest.importorskip("torch")

# Each rank's SIGTERM handler waits to receive from its peer, which waits the same:
# both block in gloo with no CPU time going by, as Lightning's ranks do.
STUCK = textwrap.dedent("""\
    import signal, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    def on_term(*_):
        dist.recv(torch.zeros(1), src=1 - rank)
    signal.signal(signal.SIGTERM, on_term)
    dist.barrier()
    print("up", flush=True)
    while True:
        time.sleep(0.1)
""")
# Not a distributed rank: it ignores SIGTERM and computes, so the kill wait is its own.
DEAF = textwrap.dedent("""\
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("up", flush=True)
    while True:
        sum(range(1000))
""")


def stop_with_ctrl_c(lab, tmp_path, script, kill_wait):
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(script)
    proc = lab.popen([sys.executable, "-m", "multihost", "run", "--hostfile",
                      str(hostfile(lab, tmp_path, 2)), "--launcher", "python", "--code", str(code),
                      "--no-check", "--kill-wait", str(kill_wait), "--plain", "--log_dir",
                      str(tmp_path / "log"), "--", "job.py"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_id = run_started_by(lab, proc)
        wait_running(lab, run_id, 2)
        for line in proc.stdout:     # every rank past its first collective
            if line.rstrip().endswith("up") and "[1]" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=kill_wait + 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return run_id, out + err


def test_ranks_blocked_in_a_collective_are_killed_without_the_kill_wait_and_it_is_said(
        lab, tmp_path):
    run_id, said = stop_with_ctrl_c(lab, tmp_path, STUCK, kill_wait=600)
    assert "1 rank blocked in a collective that its peers left: killed after" in said, said[-3000:]
    assert "of the 600 s kill wait" in said
    assert leftovers(lab, 2, run_id) == {}
    assert {n["state"] for n in status_json(lab, run_id)["nodes"]} == {"stopped"}


def test_a_process_that_ignores_sigterm_keeps_the_kill_wait_and_the_screen_says_so(lab, tmp_path):
    run_id, said = stop_with_ctrl_c(lab, tmp_path, DEAF, kill_wait=4)
    assert "stop waits for 1 process pid" in said and "still running after SIGTERM; SIGKILL in" in said, \
        said[-3000:]
    assert "blocked in a collective" not in said
    assert leftovers(lab, 2, run_id) == {}
