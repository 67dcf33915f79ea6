"""Long runs end to end in the lab (issue 14): --max-restarts with a checkpoint resumed,
--hang-timeout and `multihost stacks`, spare hosts.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from test_run import hostfile, leftovers, run_id_in, run_started_by, status_json, wait_running

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLES = REPO / "examples"


def test_a_rank_that_fails_once_is_restarted_and_resumes_from_its_checkpoint(lab, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(EXAMPLES / "train_ddp.py", code / "train_ddp.py")
    hosts = hostfile(lab, tmp_path, 2)
    log_dir = tmp_path / "log"
    result = lab.multihost("run", "--hostfile", str(hosts), "--code", str(code),
                           "--max-restarts", "1", "--kill-wait", "2", "--plain",
                           "--log_dir", str(log_dir), "--", "train_ddp.py", "--epochs", "1",
                           "--steps", "40", "--log-every", "10", "--checkpoint-dir", "ckpt",
                           "--checkpoint-every", "10", "--crash-at", "25", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = run_id_in(result.stderr)
    assert "attempt 1 of 2 failed" in result.stderr and "restarting as attempt 2 of 2" \
        in result.stderr, result.stderr[-3000:]
    assert f"run {run_id} failed" not in result.stderr    # the attempt failed, not the run
    assert f"logs: {log_dir}/latest/workerlog.N (this run: {log_dir}/{run_id}/attempt_1)" \
        in result.stderr, result.stderr[-3000:]
    # The second attempt went on from the last checkpoint before the crash, not step 0.
    assert "attempt 1: resumed from the checkpoint at step 20" in result.stdout
    status = status_json(lab, run_id)
    assert status["state"] == "succeeded" and status["attempt"] == 1
    assert [a["state"] for a in status["attempts"]] == ["failed"]
    assert status["attempts"][0]["root_cause"]["rank"] == 1
    # Each attempt's logs are kept apart, and `logs --attempt K` shows that attempt's.
    first = lab.multihost("logs", run_id, "--attempt", "1", timeout=120)
    second = lab.multihost("logs", run_id, "--attempt", "2", timeout=120)
    assert "crashes at step 25" in first.stdout and "resumed" not in first.stdout
    assert "resumed from the checkpoint at step 20" in second.stdout
    assert "crashes" not in second.stdout
    assert (log_dir / run_id / "attempt_0").is_dir() and (log_dir / run_id / "attempt_1").is_dir()
    shown = lab.multihost("status", run_id, "--plain", timeout=60).stdout
    assert "attempt 2 of 2" in shown and "earlier attempt 1 of 2: failed" in shown
    assert leftovers(lab, 2, run_id) == {}


# Rank 1 stops writing early (stuck in a collective that never returns); the others go on
# for a while (9 s), then wait for it: the picture of a real NCCL hang. Its lines carry no
# step, so the line rule judges it.
HANGER = textwrap.dedent("""\
    import os, sys, time
    rank = int(os.environ["RANK"])

    def stuck_in_collective():
        time.sleep(600)

    def wait_for_peers():
        time.sleep(600)

    for step in range(3 if rank == 1 else 30):
        print("rank %d tick %d" % (rank, step), flush=True)
        time.sleep(0.3)
    stuck_in_collective() if rank == 1 else wait_for_peers()
""")


def said(log_dir: Path, run_id: str, text: str) -> bool:
    """Whether a rank's log mirrored on the controller holds ``text`` yet."""
    return any(text in path.read_text(errors="replace")
               for path in (log_dir / run_id).rglob("workerlog.*") if path.is_file())


def test_a_silent_rank_is_flagged_and_a_hang_is_stopped_with_every_stack(lab, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "hanger.py").write_text(HANGER)
    hosts = hostfile(lab, tmp_path, 3)
    log_dir = tmp_path / "log"
    proc = lab.popen([sys.executable, "-m", "multihost", "run", "--hostfile", str(hosts),
                      "--launcher", "python", "--code", str(code), "--no-check",
                      "--kill-wait", "1", "--hang-timeout", "14", "--plain",
                      "--log_dir", str(log_dir), "--", "hanger.py"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_id = None
    try:
        run_id = run_started_by(lab, proc)
        wait_running(lab, run_id, 3)
        # Every rank has stopped writing: the others wait for rank 1 (after their last tick).
        deadline = time.monotonic() + 60
        while not all(said(log_dir, run_id, f"rank {rank} tick 29") for rank in (0, 2)):
            assert time.monotonic() < deadline and proc.poll() is None, "ranks 0,2 never ended"
            time.sleep(0.2)
        time.sleep(1.0)
        # `multihost stacks` while it runs: identical stacks grouped, the odd rank named.
        shown = lab.multihost("stacks", run_id, "--json", timeout=60)
        assert shown.returncode == 0, shown.stderr
        groups = json.loads(shown.stdout)["groups"]
        assert [g["ranks"] for g in groups] == [[0, 2], [1]], groups
        assert "wait_for_peers" in groups[0]["stack"] and "stuck_in_collective" in groups[1]["stack"]
        text = lab.multihost("stacks", run_id, timeout=60).stdout
        assert "ranks 0,2 (2 rank(s) on 198.18.0.11, 198.18.0.13):" in text
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "rank 1 silent for" in out + err and "while other ranks write" in out + err
    last = err.strip().splitlines()[-1]
    assert "hung: no rank wrote a line for 14s" in last, last
    stacks = (log_dir / run_id / "stacks-0.txt").read_text()
    assert stacks.index("wait_for_peers") < stacks.index("stuck_in_collective")
    assert "ranks 1 (1 rank(s) on 198.18.0.12):" in stacks
    assert leftovers(lab, 3, run_id) == {}


# The same hang, but no rank falls silent: rank 1 stops stepping and loops on a warning,
# the others step on for a while, then wait for it printing a heartbeat. Every rank says
# when it made its last step and when the stop reached it.
STALLER = textwrap.dedent("""\
    import os, signal, sys, time
    rank = int(os.environ["RANK"])

    def stopped(signum, frame):
        print("rank %d stopped at %.3f" % (rank, time.time()), flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stopped)

    def stuck_in_collective():
        while True:
            print("rank %d: NCCL watchdog: collective still pending" % rank, flush=True)
            time.sleep(0.5)

    def wait_for_peers():
        while True:
            print("rank %d: waiting for peers" % rank, flush=True)
            time.sleep(0.5)

    for step in range(4 if rank == 1 else 20):
        print("rank %d step %d" % (rank, step), flush=True)
        time.sleep(0.3)
    print("rank %d last stepped at %.3f" % (rank, time.time()), flush=True)
    stuck_in_collective() if rank == 1 else wait_for_peers()
""")


def times_said(text: str, what: str) -> list:
    return [float(m) for m in re.findall(r"rank \d+ " + what + r" at (\d+\.\d+)", text)]


def test_a_rank_that_stops_stepping_while_it_prints_is_flagged_and_the_run_stopped_as_hung(
        lab, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "staller.py").write_text(STALLER)
    hosts = hostfile(lab, tmp_path, 3)
    log_dir = tmp_path / "log"
    timeout = 6
    result = lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python",
                           "--code", str(code), "--no-check", "--kill-wait", "2",
                           "--hang-timeout", str(timeout), "--plain", "--log_dir", str(log_dir),
                           "--", "staller.py", timeout=300)
    out, err = result.stdout, result.stderr
    assert result.returncode == 1, err[-3000:]
    run_id = run_id_in(err)
    # Lines kept coming to the end; the step rule called it hung all the same.
    assert "rank 1 made no step for" in err and "while other ranks go on" in err, err[-3000:]
    assert "rank 0: waiting for peers" in out and "collective still pending" in out
    last = err.strip().splitlines()[-1]
    assert f"hung: no rank made a step for {timeout}s" in last, last
    # Stopped within S + 5 s of the last step any rank made (clocks: one machine).
    last_step, stops = max(times_said(out, "last stepped")), times_said(out, "stopped")
    assert stops and min(stops) - last_step <= timeout + 5, (last_step, stops)
    stacks = (log_dir / run_id / "stacks-0.txt").read_text()
    assert "ranks 0,2 (2 rank(s) on 198.18.0.11, 198.18.0.13):" in stacks, stacks
    assert "ranks 1 (1 rank(s) on 198.18.0.12):" in stacks
    assert stacks.index("wait_for_peers") < stacks.index("stuck_in_collective")
    assert leftovers(lab, 3, run_id) == {}


# Every rank steps for the same 9 s; rank 2 sleeps twice as long per step.
SLOWPOKE = textwrap.dedent("""\
    import os, time
    rank = int(os.environ["RANK"])
    pause = 0.4 if rank == 2 else 0.2
    began, step = time.time(), 0
    while time.time() - began < 9:
        step += 1
        print("rank %d step %d" % (rank, step), flush=True)
        time.sleep(pause)
""")


def test_the_summary_names_the_slow_rank_as_a_straggler_and_no_other(lab, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "slowpoke.py").write_text(SLOWPOKE)
    hosts = hostfile(lab, tmp_path, 3)
    result = lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python",
                           "--code", str(code), "--no-check", "--plain",
                           "--log_dir", str(tmp_path / "log"), "--", "slowpoke.py", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = run_id_in(result.stderr)
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"multihost: stragglers: 198\.18\.0\.13 rank 2 at 0\.[3-6]\dx "
                        r"the median step rate", last), last
    status = status_json(lab, run_id)
    assert [s["rank"] for s in status["stragglers"]] == [2], status["stragglers"]
    shown = lab.multihost("status", run_id, "--plain", timeout=60).stdout
    assert "stragglers: 198.18.0.13 rank 2 at" in shown
