"""bench/gpu_truth.sh --dry-run: the GPU truth script (issue 30) against the lab's
stand-in nvidia-smi, on the CPU, in local mode: its folder holds nvidia-smi recorded as
multihost calls it, and a summary where every step that needs CUDA is skipped, not
failed, after a rehearsal on the CPU that went through the same plumbing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from multihost.check.parsers import parse_gpu_use
from multihost.remote.check import ops as ops_check
from multihost.remote.run import gpus as run_gpus

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_truth.sh"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    pytest.importorskip("torch")
    if not shutil.which("timeout"):
        pytest.skip("no timeout(1)")
    base = tmp_path_factory.mktemp("gpu-truth")
    out = base / "out"
    # A machine of its own: its own home and host registry (runs of others are busy).
    env = dict(os.environ, HOME=str(base / "home"), PYTHON=sys.executable,
               JOB_PYTHON=sys.executable, MULTIHOST_HOLDS_DIR=str(base / "holds"))
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run", str(out)], env=env, cwd=base,
                          capture_output=True, text=True, timeout=300)
    return done, out


def test_the_dry_run_passes_with_every_cuda_step_skipped_after_its_cpu_rehearsal(dry_run):
    done, out = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = {row["step"]: row for row in json.loads((out / "summary.json").read_text())["steps"]}
    assert sorted(steps) == ["1", "2", "3", "4", "5", "6"]
    assert steps["1"]["status"] == "ok"
    for number in "23456":
        assert steps[number]["status"] == "skipped: no CUDA", steps[number]
    for number in "3456":          # 2 needs the check's GPU query, which the stand-in refuses
        assert steps[number]["rehearsal"] == "ok", steps[number]
    text = (out / "summary.txt").read_text()
    assert "step 6  exit 0,0,0,0" in text and "skipped: no CUDA" in text


def test_nvidia_smi_is_recorded_with_the_argvs_multihost_runs(dry_run):
    _, out = dry_run
    smi = out / "nvidia-smi"
    calls = [line.split("\t") for line in (smi / "calls.tsv").read_text().splitlines()]
    argvs = {name: json.loads(argv) for name, _, _, argv in calls}
    assert argvs["gpus"] == ops_check.GPU_QUERY and argvs["apps"] == ops_check.APPS_QUERY
    assert argvs["use"] == [str(out / "standin" / "nvidia-smi"), "--query-gpu=" + run_gpus.QUERY,
                            "--format=csv,noheader,nounits"]
    # The stand-in refuses check's queries, and that refusal is what was kept.
    assert (smi / "gpus.rc").read_text().strip() == "2"
    assert "only the GPU sampler's query" in (smi / "gpus.err").read_text()
    header = (smi / "header.txt").read_text()
    assert "torch (version, cuda, cuda available): " in header and "nvidia-smi -L (exit 2)" in header


def test_the_replay_file_has_the_stand_ins_format_with_the_runs_samples(dry_run):
    _, out = dry_run
    text = (out / "nvidia-smi" / "nvidia-smi-use-standin.csv").read_text()
    assert text.startswith("# A recording of `nvidia-smi --query-gpu=" + run_gpus.QUERY)
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    blocks = [block for block in body.split("\n\n") if block.strip()]
    # Three idle samples of the 8 recorded GPUs, then the training run's GPU 0 only.
    assert [len(parse_gpu_use(block)) for block in blocks[:3]] == [8, 8, 8]
    assert len(blocks) > 3 and all(len(parse_gpu_use(b)) == 1 for b in blocks[3:])
    assert "(node 0): gpu " in (out / "3-run.err").read_text()
