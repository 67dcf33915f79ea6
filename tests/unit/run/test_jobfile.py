"""Job files: TOML read with tomllib/tomli, flags beat the file, unknown keys refused;
the resolved job a run records, and the setup step and rerun on this machine."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from multihost.run import jobfile, launchers
from multihost.cli import build_parser
from multihost.commands.jobargs import defaults, with_job_file
from multihost.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


def run_args(*words):
    return with_job_file(build_parser("run").parse_args(["run", *words]))


def test_flags_on_the_command_line_beat_the_file(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('hosts = ["10.0.0.1", "10.0.0.2"]\ngpus = "0-3"\ncode = "src"\n'
                   'command = ["train.py", "-c", "cfg.yml"]\n[env]\nA = "file"\nB = "file"\n')
    args = run_args("-f", str(job), "--gpus", "0,1", "--env", "B=cli")
    assert args.ips == "10.0.0.1,10.0.0.2" and args.gpus == "0,1"
    assert args.code == str(tmp_path / "src")  # relative to the job file
    assert args.env == ["A=file", "B=file", "B=cli"]  # later wins when merged
    assert args.command == ["--", "train.py", "-c", "cfg.yml"]
    args = run_args("-f", str(job), "--ips=10.0.0.9", "--", "other.py")
    assert args.ips == "10.0.0.9" and args.command == ["--", "other.py"]


@pytest.mark.parametrize("name", launchers.BUILTIN)
def test_a_built_in_launcher_named_in_a_job_file_is_the_built_in_not_a_file(tmp_path, name):
    job = tmp_path / "job.toml"
    job.write_text(f'launcher = "{name}"\ncommand = ["train.py"]\n')
    args = run_args("-f", str(job))
    assert args.launcher == name
    assert launchers.load_template(args.launcher).builtin
    assert jobfile.resolved(vars(args), defaults(args), ["train.py"])["launcher"] == name


def test_a_launcher_file_in_a_job_file_is_relative_to_the_file(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('launcher = "my.tmpl"\ncommand = ["train.py"]\n')
    assert run_args("-f", str(job)).launcher == str(tmp_path / "my.tmpl")


def test_unknown_key_is_named_with_the_file_and_the_known_keys(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('code = "."\ngpu = "0"\n')
    with pytest.raises(ConfigError, match=r"job.toml: unknown key 'gpu' .*known keys are: hosts"):
        run_args("-f", str(job))


@pytest.mark.parametrize("text, words", [
    ('port = "x"\n', ["port is 'x'"]),
    ("port = 70000\n", ["job.toml", "--port", "70000"]),
    ("no_check = 1\n", ["no_check is 1", "true or false"]),
    ('command = "train.py \'open"\n', ["command", "quotation"]),
    ('hosts = "a"\nhostfile = "h"\n', ["both hosts and hostfile"]),
    ("code = \n", ["not valid TOML"]),
])
def test_bad_values_are_one_error_naming_the_file(tmp_path, text, words):
    job = tmp_path / "job.toml"
    job.write_text(text)
    with pytest.raises(ConfigError) as caught:
        run_args("-f", str(job))
    for word in words:
        assert word in str(caught.value)


def test_resolved_job_round_trips_with_secrets_masked(tmp_path):
    args = run_args("--ips=10.0.0.1", "--nproc_per_node", "2", "--env", "HF_TOKEN=abcd",
                    "--env", "NCCL_DEBUG=INFO", "--setup", "pip install -r r.txt",
                    "--", "train.py", "--lr", "0.1")
    table = jobfile.resolved(vars(args), defaults(args), ["train.py", "--lr", "0.1"])
    path = tmp_path / "job.toml"
    path.write_text(jobfile.dump(table))
    again = jobfile.load(str(path))
    assert again["hosts"] == "10.0.0.1" and again["nproc_per_node"] == 2
    assert again["env"] == {"HF_TOKEN": "***", "NCCL_DEBUG": "INFO"}
    assert again["command"] == ["train.py", "--lr", "0.1"]
    assert jobfile.masked_secrets(again) == ["HF_TOKEN"]


def multihost(home, cwd, *argv):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MULTIHOST_", "FLAGS_"))
           or k == "MULTIHOST_HOLDS_DIR"}  # this test's own host registry (conftest)
    env.update(HOME=str(home), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "multihost", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_setup_skipped_when_unchanged_and_rerun_starts_the_run_again(tmp_path):
    """On this machine (no ssh): the setup runs once, is skipped while nothing changed,
    runs again when the code changes; rerun repeats the job, --same-code refuses a change."""
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    (project / "train.py").write_text("import os\nprint('rank', os.environ['RANK'])\n")
    (project / "job.toml").write_text(
        'launcher = "python"\nno_check = true\nnproc_per_node = 2\n'
        'setup = "echo installing >> $HOME/setup-count"\ncommand = ["train.py"]\n')
    first = multihost(home, project, "run", "-f", "job.toml", "--plain")
    assert first.returncode == 0, first.stderr
    assert "rank 1" in first.stdout
    second = multihost(home, project, "run", "-f", "job.toml", "--plain")
    assert second.returncode == 0 and "setup unchanged" in second.stderr
    assert (home / "setup-count").read_text().count("installing") == 1
    (project / "train.py").write_text("import os\nprint('rank', os.environ['RANK'], 'v2')\n")
    rerun = multihost(home, project, "rerun", "--plain")
    assert rerun.returncode == 0, rerun.stderr
    assert "v2" in rerun.stdout and "setup done" in rerun.stderr
    assert (home / "setup-count").read_text().count("installing") == 2
    (project / "train.py").write_text("print('v3')\n")
    refused = multihost(home, project, "rerun", "--same-code", "--plain")
    assert refused.returncode == 2 and "--same-code" in refused.stderr
    assert "v3" not in refused.stdout


def test_a_failed_setup_stops_before_launch_naming_host_exit_and_last_lines(tmp_path):
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    (project / "train.py").write_text("open('launched', 'w')\n")
    result = multihost(home, project, "run", "--no-check", "--launcher", "python", "--plain",
                       "--setup", "echo resolving; echo 'No matching distribution' >&2; exit 3",
                       "--", "train.py")
    assert result.returncode == 5, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("multihost: 127.0.0.1: setup") and "exited 3" in last
    assert "No matching distribution" in last and "(fix: " in last
    assert not any(home.rglob("launched"))


def test_rerun_from_another_directory_syncs_the_runs_code_and_takes_new_arguments(tmp_path):
    home, project, elsewhere = tmp_path / "home", tmp_path / "project", tmp_path / "elsewhere"
    for directory in (home, project, elsewhere):
        directory.mkdir()
    (project / "train.py").write_text("import sys\nprint('args', *sys.argv[1:])\n")
    (elsewhere / "train.py").write_text("print('the wrong project')\n")
    first = multihost(home, project, "run", "--no-check", "--launcher", "python", "--plain",
                      "--", "train.py", "--epochs", "3")
    assert first.returncode == 0 and "args --epochs 3" in first.stdout, first.stderr
    run_id = next(p.name for p in (home / ".multihost" / "runs").iterdir() if p.is_dir())
    resumed = multihost(home, elsewhere, "rerun", run_id, "--plain", "--", "--resume", "ckpt.pt")
    assert resumed.returncode == 0, resumed.stderr
    assert "args --resume ckpt.pt" in resumed.stdout and "wrong project" not in resumed.stdout
    again = multihost(home, elsewhere, "rerun", "--plain")      # the last run: the resumed one
    assert "args --resume ckpt.pt" in again.stdout, again.stderr
    last = multihost(home, elsewhere, "rerun", "--plain", "--", "--epochs", "1")
    assert "args --epochs 1" in last.stdout, last.stderr
    assert not (elsewhere / "log").exists() and len(list((project / "log").iterdir())) >= 4


def test_the_program_of_a_command_is_its_script_or_its_module():
    assert jobfile.program_words(["train.py", "--lr", "1"]) == ["train.py"]
    assert jobfile.program_words(["-m", "pkg.train", "--lr", "1"]) == ["-m", "pkg.train"]


def test_an_image_in_a_job_file_is_the_runs_image_and_a_flag_beats_it(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('hosts = "10.0.0.1"\nimage = "nvcr.io/nvidia/pytorch:24.05-py3"\n'
                   'engine = "podman"\nimage_from_controller = true\ncommand = "train.py"\n')
    args = run_args("-f", str(job))
    assert (args.image, args.engine, args.image_from_controller) == (
        "nvcr.io/nvidia/pytorch:24.05-py3", "podman", True)
    assert run_args("-f", str(job), "--image", "mine:1").image == "mine:1"
