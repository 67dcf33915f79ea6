"""Long runs end to end in the lab (issue 14): --max-restarts with a checkpoint resumed,
--hang-timeout and `multihost stacks`, spare hosts.
"""
from __future__ import annotations

import json
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
