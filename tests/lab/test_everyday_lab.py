"""Everyday use across real hosts: the setup step on every host (once, then skipped while
nothing changed; a failure on one host stops everything before launch), `rerun` on the
hosts the run recorded, and `multihost ssh` into a rank's host and workdir; and on the
controller alone (no hosts), a job that runs in place, as under torchrun."""
from __future__ import annotations

import shutil
import subprocess
import sys

from test_run import run_id_in


def job_dir(tmp_path, lab):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import os, socket\n"
                                      "print('rank', os.environ['RANK'], socket.gethostname())\n")
    shutil.copy(lab.hostfile, project / "hosts.ini")
    return project


def setup_counts(lab):
    counts = []
    for i in range(1, lab.n + 1):
        done = lab.host_run(i, ["sh", "-c", "cat /root/setup-count 2>/dev/null || true"])
        counts.append(done.stdout.count("installing"))
    return counts


def test_setup_runs_once_on_every_host_then_is_skipped_and_rerun_repeats_the_job(lab, tmp_path):
    project = job_dir(tmp_path, lab)
    (project / "job.toml").write_text(
        'hostfile = "hosts.ini"\nlauncher = "python"\nnproc_per_node = 1\n'
        'setup = "echo installing >> /root/setup-count"\ncommand = ["train.py"]\n')
    for i in range(1, lab.n + 1):
        lab.host_run(i, ["rm", "-f", "/root/setup-count"])
    first = lab.multihost("run", "-f", "job.toml", "--plain", cwd=str(project))
    assert first.returncode == 0, first.stderr
    assert setup_counts(lab) == [1] * lab.n
    for rank in range(lab.n):
        assert f"rank {rank} h{rank + 1}" in first.stdout
    again = lab.multihost("rerun", "--plain", cwd=str(project))
    assert again.returncode == 0, again.stderr
    assert "setup unchanged" in again.stderr and setup_counts(lab) == [1] * lab.n
    assert all(f"rank {rank} h{rank + 1}" in again.stdout for rank in range(lab.n))


def test_a_setup_that_fails_on_one_host_launches_nothing_anywhere(lab, tmp_path):
    project = job_dir(tmp_path, lab)
    (project / "train.py").write_text("open('/root/launched', 'w')\n")
    for i in range(1, lab.n + 1):
        lab.host_run(i, ["rm", "-f", "/root/launched"])
    setup = "[ \"$(hostname)\" != h3 ] || { echo 'No matching distribution' >&2; exit 3; }"
    done = lab.multihost("run", "--hostfile", "hosts.ini", "--launcher", "python", "--plain",
                         "--setup", setup, "--", "train.py", cwd=str(project))
    assert done.returncode == 5, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"multihost: {lab.address(3)}: setup") and "exited 3" in last
    assert "No matching distribution" in last and "Traceback" not in done.stderr
    for i in range(1, lab.n + 1):
        assert lab.host_run(i, ["test", "-e", "/root/launched"]).returncode == 1


def test_ssh_opens_a_shell_on_the_host_of_a_rank_in_the_runs_workdir(lab, tmp_path):
    project = job_dir(tmp_path, lab)
    done = lab.multihost("run", "--hostfile", "hosts.ini", "--launcher", "python", "--plain",
                         "--", "train.py", cwd=str(project))
    assert done.returncode == 0, done.stderr
    argv = lab.lab.exec_argv([sys.executable, "-m", "multihost", "ssh", "2"])
    shell = subprocess.run(argv, input="hostname; pwd; exit\n", capture_output=True, text=True,
                           timeout=60, env=lab.env, cwd=str(project))
    assert shell.returncode == 0, shell.stderr
    lines = shell.stdout.split()
    assert "h3" in lines and "/root/work/project" in lines   # the hostfile workdir/<project>


WRITES_OUT = ("import os\n"
              "open('out%s.txt' % os.environ['RANK'], 'w').write(os.getcwd())\n")


def test_with_no_hosts_the_job_runs_in_place_and_its_outputs_land_in_the_cwd(lab, tmp_path):
    # --allow-concurrent: the controller's machine may hold other runs (other tests')
    # Two projects of one name: each runs in its own directory, nothing shared or copied.
    projects = [tmp_path / side / "proj" for side in ("a", "b")]
    for project in projects:
        project.mkdir(parents=True)
        (project / "train.py").write_text(WRITES_OUT)
        done = lab.multihost("run", "--nproc_per_node", "2", "--launcher", "python", "--plain",
                             "--allow-concurrent", "--", "train.py", cwd=str(project))
        assert done.returncode == 0, done.stderr
        assert "syncing" not in done.stderr
        for rank in (0, 1):
            assert (project / f"out{rank}.txt").read_text() == str(project)


def test_with_no_hosts_workdir_still_chooses_where_the_job_runs(lab, tmp_path):
    project, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    project.mkdir()
    (project / "train.py").write_text(WRITES_OUT)
    done = lab.multihost("run", "--nproc_per_node", "1", "--launcher", "python", "--plain",
                         "--allow-concurrent", "--workdir", str(elsewhere), "--", "train.py",
                         cwd=str(project))
    assert done.returncode == 0, done.stderr
    assert (elsewhere / "out0.txt").read_text() == str(elsewhere)
    assert not (project / "out0.txt").exists()


def test_rerun_with_new_arguments_from_another_directory_runs_the_runs_own_code(lab, tmp_path):
    project = job_dir(tmp_path, lab)
    (project / "train.py").write_text("import os, sys, socket\nprint('rank', os.environ['RANK'], "
                                      "socket.gethostname(), 'args', *sys.argv[1:])\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "train.py").write_text("print('the code of another directory')\n")
    first = lab.multihost("run", "--hostfile", "hosts.ini", "--launcher", "python", "--plain",
                          "--", "train.py", "--epochs", "3", cwd=str(project))
    assert first.returncode == 0, first.stderr
    run_id = run_id_in(first.stderr)
    again = lab.multihost("rerun", run_id, "--plain", "--", "--resume", "ckpt/last.pt",
                          cwd=str(elsewhere))
    assert again.returncode == 0, again.stderr
    for rank in range(lab.n):
        assert f"rank {rank} h{rank + 1} args --resume ckpt/last.pt" in again.stdout, again.stdout
    assert "another directory" not in again.stdout and str(project) in again.stderr


def test_two_projects_with_one_hostfile_workdir_keep_and_fetch_their_own_files(lab, tmp_path):
    fetched = {}
    for name in ("alpha", "beta"):
        project = tmp_path / name
        project.mkdir()
        shutil.copy(lab.hostfile, project / "hosts.ini")     # workdir = /root/work
        (project / "train.py").write_text(f"import os\nos.makedirs('out', exist_ok=True)\n"
                                          f"open('out/ckpt.txt', 'w').write('{name}')\n"
                                          f"print('cwd', os.getcwd())\n")
        done = lab.multihost("run", "--hostfile", "hosts.ini", "--launcher", "python",
                             "--plain", "--", "train.py", cwd=str(project))
        assert done.returncode == 0, done.stderr
        assert f"cwd /root/work/{name}" in done.stdout
    for name in ("alpha", "beta"):
        got = tmp_path / f"got-{name}"
        done = lab.multihost("fetch", "out/ckpt.txt", "--to", str(got), cwd=str(tmp_path / name))
        assert done.returncode == 0, done.stderr
        fetched[name] = (got / "out" / "ckpt.txt").read_text()
    assert fetched == {"alpha": "alpha", "beta": "beta"}
