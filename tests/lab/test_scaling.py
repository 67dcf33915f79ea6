"""`multihost scale` end to end (issue 15): the example trainer measured on 1, 2 and 3 lab
hosts, each point an ordinary run that is stopped once measured; the table as JSON, the
PNG chart, and the point runs in `status --list`. Kept cheap (one process a host, one
second a point, few log lines): what it proves is the shape, not the numbers."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from test_run import hostfile, leftovers

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


def test_scale_measures_one_two_and_three_hosts_and_writes_the_table_and_chart(lab, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(EXAMPLES / "train_ddp.py", code / "train_ddp.py")
    png = tmp_path / "scaling.png"
    done = lab.multihost("scale", "--hostfile", str(hostfile(lab, tmp_path, 3)),
                         "--code", str(code), "--nproc_per_node", "1", "--seconds", "1",
                         "--kill-wait", "1", "--log_dir", str(tmp_path / "log"),
                         "--png", str(png), "--json", "--metric-is", "global",
                         # no torchrun: its own torch import per host and point is most
                         # of a point's cost, and scale's path is the same for any launcher
                         "--launcher", "python", "--", "train_ddp.py",
                         "--epochs", "100000", "--log-every", "10", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    table = json.loads(done.stdout)
    points = table["points"]
    assert [p["machines"] for p in points] == [1, 2, 3]          # 1, 2, 4, ... and all: 3
    assert all(p["nproc_per_node"] == 1 and p["throughput"] > 0 for p in points)
    assert [p["processes"] for p in points] == [1, 2, 3]
    assert points[0]["speedup"] == 1.0 and points[0]["efficiency"] == 1.0
    for p in points:   # the example prints the job's speed on every rank: taken once
        assert p["rule"] == "global" and p["ranks"] == p["machines"] and p["samples"] > 0
        assert abs(p["efficiency"] - p["speedup"] / p["machines"]) < 1e-3
    assert table["png"] == str(png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    # Each point is an ordinary run, stopped once measured, with nothing left behind.
    listed = {run["run_id"]: run for run in
              json.loads(lab.multihost("status", "--list", "--json", timeout=60).stdout)}
    for p in points:
        assert listed[p["run_id"]]["state"] == "stopped"
        assert len(listed[p["run_id"]]["hosts"]) == p["machines"]
        assert leftovers(lab, p["machines"], p["run_id"]) == {}
    assert "chart written to" in done.stderr
    # One check of the whole cluster, before the first point; none per point.
    assert done.stderr.count("checking ") == 1 and "checking 3 host(s)" in done.stderr


# Prints the job's speed a few times, then fails on the 2-host point only.
FAILS_ON_TWO = """\
import os, sys
for step in range(1, 6):
    print("step: %d, speed: %d" % (step, 100 * int(os.environ["MULTIHOST_NUM_NODES"])), flush=True)
sys.exit(3 if os.environ["MULTIHOST_NUM_NODES"] == "2" else 0)
"""


@pytest.fixture
def fails_on_two(tmp_path) -> Path:
    """A code directory holding job.py (FAILS_ON_TWO)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(FAILS_ON_TWO)
    return code


def test_a_failing_point_ends_scaling_with_its_error_after_the_points_before_it(
        lab, tmp_path, fails_on_two):
    code = fails_on_two
    done = lab.multihost("scale", "--hostfile", str(hostfile(lab, tmp_path, 3)),
                         "--code", str(code), "--launcher", "python", "--no-png",
                         "--log_dir", str(tmp_path / "log"), "--markdown", "--", "job.py",
                         timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 1 and "| 100.0 | 1.00 | 100% |" in rows[0]   # the 1-host point kept
    assert "| 2 |" not in done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("multihost: ") and "failed" in error and "Traceback" not in done.stderr


def test_rerun_starts_a_scale_point_again_as_a_plain_run_on_its_hosts(
        lab, tmp_path, fails_on_two):
    done = lab.multihost("scale", "--hostfile", str(hostfile(lab, tmp_path, 2)),
                         "--code", str(fails_on_two), "--launcher", "python", "--no-png",
                         "--counts", "1", "--log_dir", str(tmp_path / "log"), "--json",
                         "--", "job.py", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    point = json.loads(done.stdout)["points"][0]
    again = lab.multihost("rerun", point["run_id"], "--plain", timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "step: 5, speed: 100" in again.stdout             # the point's job, on 1 host
