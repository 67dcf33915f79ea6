"""Programs nobody here wrote, in the lab: PyTorch Lightning (its default bar, rich, and
its TQDM bar), Hugging Face's Trainer and an Accelerate loop with tqdm on 2 hosts, their progress bars redrawn with
\\r. Their steps must reach ``--json`` (progress and metrics records) while they run,
not when their line ends."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

PROGRAMS = Path(__file__).resolve().parent / "programs"


def two_hosts(lab, tmp_path) -> Path:
    hosts = tmp_path / "two.ini"
    hosts.write_text(f"[defaults]\nuser = root\npython = {sys.executable}\nworkdir = /tmp/programs\n"
                     f"[{lab.address(1)}]\n[{lab.address(2)}]\n")
    return hosts


def run_json(lab, tmp_path, *job, env=(), options=()):
    flags = [word for pair in env for word in ("--env", pair)] + list(options)
    done = lab.multihost("run", "--hostfile", str(two_hosts(lab, tmp_path)), "--nproc_per_node", "1",
                         "--code", str(PROGRAMS), "--no-check", "--json", *flags,
                         "--log_dir", str(tmp_path / "log"), "--", *job, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def live_steps(records, rank=0):
    """The steps of a rank's bar seen while its line was still being redrawn."""
    ended = next(i for i, r in enumerate(records) if r["event"] == "node" and r["state"] == "succeeded")
    steps = []
    for i, record in enumerate(records[:ended]):
        if record["event"] == "metrics" and record["rank"] == rank and record["step"] is not None \
                and records[i - 1]["event"] == "progress":
            steps.append(record["step"])
    return steps


@pytest.mark.parametrize("bar", ["default", "tqdm"])
def test_a_lightning_jobs_bar_gives_live_steps_and_loss(lab, tmp_path, bar):
    records = run_json(lab, tmp_path, "lightning_job.py", "--steps", "12", "--nap", "0.4",
                       "--bar", bar)
    steps = live_steps(records)
    assert len(set(steps)) >= 3 and steps == sorted(steps), steps   # it moved, in order
    losses = [r["loss"] for r in records if r["event"] == "metrics" and r["loss"] is not None]
    assert losses, "Lightning's train_loss field was never read"
    progress = [r["text"] for r in records if r["event"] == "progress"]
    assert all("\x1b" not in text and "\r" not in text for text in progress)
    assert any("done" == r.get("text") for r in records if r["event"] == "line")


def test_richs_bar_told_it_has_no_terminal_draws_nothing_until_the_end(lab, tmp_path):
    """Why multihost sets TTY_COMPATIBLE=1: without it, Lightning's rich bar is silent."""
    records = run_json(lab, tmp_path, "lightning_job.py", "--steps", "8", "--nap", "0.4",
                       env=["TTY_COMPATIBLE=0"])
    assert live_steps(records) == []
    assert [r for r in records if r["event"] == "metrics" and r["step"] == 8]   # at the end


def test_hugging_faces_trainer_gives_live_steps_and_the_loss_of_its_log_dict(lab, tmp_path):
    records = run_json(lab, tmp_path, "hf_trainer_job.py", "--steps", "12", "--nap", "0.4",
                       "--out", "/tmp/programs/hf_out")
    steps = live_steps(records)
    assert len(set(steps)) >= 3 and steps == sorted(steps), steps
    # {'loss': '0.6932', ..., 'epoch': '0.0125'}: the Trainer's dict line, numbers as text
    logged = [r for r in records if r["event"] == "metrics" and r["loss"] is not None
              and r["epoch"] is not None]
    assert len(logged) >= 6, logged


def test_a_lightning_world_size_that_multihost_did_not_start_is_named_with_the_flag_to_give(
        lab, tmp_path):
    done = lab.multihost("run", "--hostfile", str(two_hosts(lab, tmp_path)), "--nproc_per_node", "1",
                         "--code", str(PROGRAMS), "--no-check", "--plain", "--log_dir",
                         str(tmp_path / "log"), "--", "lightning_job.py", "--devices", "2",
                         "--num_nodes", "2", "--steps", "2", timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "Lightning asks devices=2 x num_nodes=2 = 4 processes; multihost started 2 hosts x 1 " \
           "process = 2: give --nproc_per_node 2" in last, done.stderr[-3000:]


def test_an_accelerate_loops_tqdm_bar_gives_live_steps_and_loss(lab, tmp_path):
    records = run_json(lab, tmp_path, "accelerate_job.py", "--steps", "12", "--nap", "0.4")
    steps = live_steps(records)
    assert len(set(steps)) >= 3 and steps == sorted(steps), steps
    assert [r for r in records if r["event"] == "metrics" and r["loss"] is not None]


def test_accelerate_launch_as_the_launcher_starts_every_host_and_gives_live_steps(lab, tmp_path):
    """``--launcher accelerate``: one ``accelerate launch`` per host, its ranks the job's."""
    records = run_json(lab, tmp_path, "accelerate_job.py", "--steps", "12", "--nap", "0.4",
                       options=["--launcher", "accelerate"])
    steps = live_steps(records)
    assert len(set(steps)) >= 3 and steps == sorted(steps), steps
    # accelerate's own words, from each host's launcher: it was what started the ranks
    said = [r for r in records if r["event"] == "line" and r.get("rank") == -1
            and "accelerate launch" in r.get("text", "")]
    assert {r["host"] for r in said} == {lab.address(1), lab.address(2)}, said
