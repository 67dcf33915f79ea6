"""`run --slurm --detach`: the batch job's command line, its submission, and what
`status`, `stop` and `logs` say of it from the login node (Slurm's tools stood in for)."""
from __future__ import annotations

import json
import os
import sys
import time
from types import SimpleNamespace

import pytest

from multihost.cli import build_parser, main
from multihost.commands.run_batch import batch_argv
from multihost.slurm.batch import line, state_of
from multihost.slurm.ending import parse_scontrol

PY = [sys.executable, "-m", "multihost", "run"]


def args_of(*words):
    return build_parser("run").parse_args(["run", *words])


def test_the_job_runs_the_same_run_without_the_slurm_flags_in_either_spelling():
    args = args_of("--slurm", "-N", "2", "--partition=a100", "--time", "1:00:00", "--gres=gpu:4",
                   "--detach", "--nproc_per_node", "2", "--name", "exp1", "--", "train.py",
                   "--time", "5", "--detach", "-N", "3")
    assert batch_argv(args) == PY + ["--nproc_per_node", "2", "--name", "exp1", "--plain", "--",
                                     "train.py", "--time", "5", "--detach", "-N", "3"]


def test_short_and_glued_spellings_are_dropped_and_values_kept_whole():
    args = args_of("-N2", "--slurm", "--partition", "a100", "--nodes=2", "--setup", "--detach x",
                   "--detach", "--json", "--code", "src", "train.py", "-c", "cfg.yml")
    assert batch_argv(args) == PY + ["--setup", "--detach x", "--json", "--code", "src",
                                     "train.py", "-c", "cfg.yml"]


SCONTROL = ("JobId={job} JobName=multihost UserId=root(0) JobState={state} Reason={reason} "
            "Dependency=(null) ExitCode={code} RunTime=00:00:03 NodeList={nodes} "
            "BatchHost=h1 WorkDir=/shared/my dir StdErr=/shared/my dir/slurm-{job}.out "
            "StdIn=/dev/null StdOut=/shared/my dir/slurm-{job}.out Power=")


def scontrol(state="RUNNING", reason="None", code="0:0", nodes="h[1-2]", job="12"):
    return SCONTROL.format(job=job, state=state, reason=reason, code=code, nodes=nodes)


@pytest.mark.parametrize("text, shown", [
    (scontrol("PENDING", "Resources", nodes="(null)"), "queued (Slurm job 12, Resources)"),
    (scontrol(), "running as Slurm job 12 on h[1-2]; output: /shared/my dir/slurm-12.out"),
    (scontrol("COMPLETED"), "Slurm job 12 ended: COMPLETED, exit 0; output: /shared/my dir/slurm-12.out"),
    (scontrol("FAILED", "NonZeroExitCode", "3:0"),
     "Slurm job 12 ended: FAILED, exit 3; output: /shared/my dir/slurm-12.out"),
    (scontrol("CANCELLED", code="0:15"),
     "Slurm job 12 ended: CANCELLED, exit 0, signal 15; output: /shared/my dir/slurm-12.out"),
])
def test_status_says_queued_running_or_how_the_job_ended(text, shown):
    assert line({"job_id": "12"}, state_of("12", parse_scontrol(text))) == shown


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """sbatch, scontrol, squeue and scancel stood in for: sbatch keeps its stdin and
    argv, scontrol shows ``state`` (scancel makes it CANCELLED)."""
    bin_dir, box = tmp_path / "bin", tmp_path / "box"
    bin_dir.mkdir()
    box.mkdir()
    tools = {
        "sbatch": f'cat > {box}/script; echo "$@" > {box}/argv; pwd > {box}/cwd; echo "42;cluster"',
        "scontrol": f'[ "$2" = job ] && [ -f {box}/state ] && cat {box}/state || exit 1',
        "squeue": "exit 0",
        "scancel": f'echo "$1" > {box}/cancelled; '
                   f"sed -i 's/JobState=RUNNING/JobState=CANCELLED/; s/ExitCode=0:0/ExitCode=0:15/' {box}/state",
    }
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.chdir(tmp_path)

    def state(**kw):
        kw = {"job": "42", **kw}
        text = scontrol(**kw).replace("/shared/my dir", str(tmp_path))
        (box / "state").write_text(text + "\n")
    return SimpleNamespace(box=box, dir=tmp_path, state=state)


def test_detach_submits_a_batch_job_that_runs_the_same_run_and_says_what_follows(slurm, capsys):
    slurm.state(state="PENDING", reason="Priority", nodes="(null)")
    code = main(["run", "--slurm", "-N", "2", "--time", "10", "--detach", "--nproc_per_node", "2",
                 "--", "train.py", "--lr", "0.1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert (slurm.box / "argv").read_text().split() == ["--parsable", "--nodes=2", "--job-name=multihost",
                                                    "--time=10"]
    assert (slurm.box / "cwd").read_text().strip() == str(slurm.dir)   # the submit directory
    body = (slurm.box / "script").read_text()
    assert body.startswith("#!/bin/sh\n")
    assert f"exec {sys.executable} -m multihost run --nproc_per_node 2 --plain -- train.py --lr 0.1" in body
    assert out.splitlines()[0] == f"submitted as Slurm job 42 (2 nodes); output: {slurm.dir}/slurm-42.out"
    assert "multihost logs --follow" in out and "scancel 42" in out
    main(["status"])
    assert capsys.readouterr().out == "queued (Slurm job 42, Priority)\n"
    slurm.state()
    main(["status", "--json"])
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == "running" and shown["slurm_job"] == "42" and shown["nodelist"] == "h[1-2]"


def test_stop_cancels_the_batch_job_and_waits_for_its_end(slurm, capsys):
    slurm.state(state="PENDING", nodes="(null)")
    main(["run", "--slurm", "-N", "2", "--detach", "--", "train.py"])
    slurm.state()
    capsys.readouterr()
    assert main(["stop"]) == 0
    assert (slurm.box / "cancelled").read_text().strip() == "42"
    assert capsys.readouterr().out.startswith("Slurm job 42 ended: CANCELLED, exit 0, signal 15 (scancel 42)")


def test_logs_shows_the_output_file_then_how_the_job_ended(slurm, capsys):
    slurm.state(state="PENDING", nodes="(null)")
    main(["run", "--slurm", "-N", "2", "--detach", "--", "train.py"])
    (slurm.dir / "slurm-42.out").write_text("h1 [0]: step 1\nh2 [1]: step 1\n")
    slurm.state(state="FAILED", code="3:0")
    capsys.readouterr()
    assert main(["logs", "--follow"]) == 3
    assert capsys.readouterr().out == ("h1 [0]: step 1\nh2 [1]: step 1\nSlurm job 42 ended: FAILED, "
                                       f"exit 3; output: {slurm.dir}/slurm-42.out\n")


def test_an_output_file_on_the_node_only_is_one_line_naming_it_and_the_node(slurm, capsys):
    slurm.state(state="PENDING", nodes="(null)")
    main(["run", "--slurm", "-N", "2", "--detach", "--", "train.py"])
    slurm.state(state="COMPLETED")
    assert main(["logs", "--follow"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("multihost: h1: the output of Slurm job 42 is ")
    assert err.endswith(f"(fix: ssh h1 cat {slurm.dir}/slurm-42.out)")


def test_a_run_recorded_after_the_submission_is_what_status_shows(slurm, capsys, monkeypatch):
    from multihost.commands import run_batch

    slurm.state(state="PENDING", nodes="(null)")
    main(["run", "--slurm", "-N", "2", "--detach", "--", "train.py"])
    assert run_batch.batch_job(None)["job_id"] == "42"

    class Later:
        created = time.time() + 5
    monkeypatch.setattr("multihost.run.records.load_run", lambda run=None: Later)
    assert run_batch.batch_job(None) is None
    assert run_batch.batch_job("42")["job_id"] == "42"   # by its Slurm job id, still


def test_no_script_is_refused_before_anything_is_submitted(slurm, capsys):
    assert main(["run", "--slurm", "-N", "2", "--detach"]) == 2
    assert "no script given" in capsys.readouterr().err
    assert not (slurm.box / "script").exists()


def test_an_output_pattern_shown_unexpanded_is_filled_in_as_slurm_does():
    from multihost.slurm.batch import JobState, output_of

    state = JobState("12", "RUNNING", output="/scratch/%x-%j.out")
    assert output_of({"job_id": "12", "name": "exp1"}, state) == "/scratch/exp1-12.out"
