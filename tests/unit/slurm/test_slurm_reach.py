"""`multihost fetch` and `multihost ssh` for a run whose nodes are steps of a Slurm job:
rsync's remote shell and the terminal session are srun steps of that job (a stand-in
srun here runs the step's command on this machine; the lab runs the real one)."""
from __future__ import annotations

import os
import pwd
import subprocess
import sys

from multihost.hosts import Host
from multihost.run.records import NodeRecord, RunRecord, host_to_dict
from multihost.run.control import ssh_options
from multihost.transport import SshOptions
from multihost.transport.srun import SrunOptions, remote_shell, terminal_argv

# What srun would do with one task: run the command after `-w NODE`; what it was asked is
# left in $SRUN_SAW.
FAKE_SRUN = f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
open(os.environ["SRUN_SAW"], "w").write("\\n".join(args))
at = args.index("-w")
os.execvp(args[at + 2], args[at + 2:])
"""


def run_record(ssh):
    host = Host("h2", 0)
    node = NodeRecord(0, host_to_dict(host), "h2", "h2", 1, 0, workdir="/srv/job")
    return RunRecord("20260101-000000-abcd", 0.0, (node,), ("train.py",), "torchrun", "",
                     ssh=ssh)


def test_a_run_recorded_as_srun_steps_is_reached_by_srun_and_others_by_ssh():
    options = ssh_options(run_record({"transport": "srun", "job_id": "7"}))
    assert isinstance(options, SrunOptions) and options.job_id == "7"
    assert remote_shell(Host("h2", 0), options)[0] == "/bin/sh"
    plain = ssh_options(run_record({"config_file": "~/.ssh/config"}))
    assert not isinstance(plain, SrunOptions)
    assert remote_shell(Host("h2", 0), plain)[0] == "ssh"


def test_rsyncs_remote_shell_runs_the_program_as_a_step_on_the_node_from_its_home(tmp_path):
    (tmp_path / "srun").write_text(FAKE_SRUN)
    (tmp_path / "srun").chmod(0o755)
    saw = tmp_path / "saw"
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", SRUN_SAW=str(saw),
               HOME="/nonexistent")
    # As rsync calls it: the remote shell, the node, then the program and its arguments.
    argv = remote_shell(Host("h2", 0), SrunOptions(job_id="7")) + [
        "h2", "sh", "-c", 'printf "%s|" "$PWD" "$@"', "sh", "a b", "c"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    home = pwd.getpwuid(os.getuid()).pw_dir
    assert done.stdout == f"{os.path.realpath(home)}|a b|c|"
    asked = saw.read_text().split("\n")
    assert asked[asked.index("-w") + 1] == "h2" and asked[asked.index("--jobid") + 1] == "7"
    assert "--overlap" in asked and "-u" in asked    # beside the run's step, bytes unbuffered


def test_a_terminal_on_a_node_of_a_slurm_job_is_srun_pty_and_ssh_t_elsewhere():
    argv = terminal_argv(Host("h2", 0), SrunOptions(job_id="7"), "cd /srv/job && exec sh -l")
    assert argv[0] == "srun" and "--pty" in argv and "--overlap" in argv
    assert argv[argv.index("-w") + 1] == "h2" and argv[argv.index("--jobid") + 1] == "7"
    assert argv[-1].endswith("cd /srv/job && exec sh -l")
    argv = terminal_argv(Host("h2", 0), SshOptions(), "cd /srv/job && exec sh -l")
    assert argv[0] == "ssh" and "-t" in argv and argv[-2:] == ["h2", "cd /srv/job && exec sh -l"]


def test_fetch_after_the_slurm_job_ended_says_so_with_a_fix_over_ssh(tmp_path, monkeypatch):
    from multihost.run.fetch import fetch
    from multihost.run.records import save_run

    (tmp_path / "srun").write_text("#!/bin/sh\necho 'srun: error: Unable to confirm allocation "
                                   "for job 7: Invalid job id specified' >&2\nexit 1\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path))
    save_run(run_record({"transport": "srun", "job_id": "7"}), make_last=True)
    (result,) = fetch(["out/model.pt"], to=str(tmp_path / "got"))
    assert result.error.startswith("Slurm job 7 has ended"), result.error
    assert result.fix.endswith(f"`rsync -rlt h2:/srv/job/out/model.pt {tmp_path}/got/out/`")
