"""Every fix the check prints works when followed literally, in the lab: each failure the
lab can produce (a busy port, a run left behind, a dataset that differs, a system
directory as workdir, GPUs asked on CPU hosts by --gpus and by CUDA_VISIBLE_DEVICES, a
python without torch, torch versions mixed across hosts, more processes than CPUs, one
machine listed twice) is made, its fix is read from what multihost printed, followed as
a user would (the command typed as shown, the flags added or dropped), and the check
then says ready.

The fleetrun case needs MULTIHOST_TEST_PADDLE=1 (see test_run.paddle_python).
"""
from __future__ import annotations

import contextlib
import re
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from multihost.check.fixes import actions
from test_check import LISTEN, on_host, second_address
from test_run import hostfile, paddle_python, run_id_in, wait_running  # noqa: F401 (fixture)

# The controller's environment, at the same path on the lab's hosts.
VENV_PYTHON = Path(sys.prefix) / "bin" / "python"
SLEEP = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def printed_fix(stdout: str, check: str, status: str = "FAIL") -> str:
    """The fix under the first ``status`` line of ``check`` in the plain report."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"{status} ") and f": {check}: " in line:
            assert lines[i + 1].startswith("     fix: "), stdout
            return lines[i + 1][len("     fix: "):]
    raise AssertionError(f"no {status} of {check} in:\n{stdout}")


def drop(argv: List[str], flag: str) -> List[str]:
    """``argv`` without ``flag`` and its value (``--gpus 0,1`` or ``--gpus=0,1``)."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == flag:
            skip = True
        elif not word.startswith(flag + "="):
            out.append(word)
    assert out != list(argv), f"{flag} is not in {argv}"
    return out


def follow(lab, fix: str, argv: List[str], env: Dict[str, str], cwd: str) -> List[str]:
    """The options of the command after following the fix's first alternative to the
    letter; a command it names is run here, as a shell would hand it over."""
    steps = actions(fix)
    assert steps, f"nothing to follow in: {fix}"
    for verb, words in steps:
        typed = shlex.split(words)
        if verb == "add":
            argv = argv + typed
        elif verb == "drop":
            argv = drop(argv, typed[0])
        elif typed[0] == "unset":
            env.pop(typed[1])
        else:
            assert typed[0] == "multihost", words
            done = lab.multihost(*typed[1:], cwd=cwd, env=env, timeout=300)
            assert done.returncode == 0, (words, done.stdout[-2000:], done.stderr[-2000:])
    return argv


def check_then_follow(lab, argv: Sequence[str], name: str, cwd: str,
                      env: Optional[Dict[str, str]] = None,
                      status: str = "FAIL") -> Tuple[str, str]:
    """`multihost check ARGV` fails ``name`` (or warns, with ``status`` WARN); its fix,
    followed, makes the check ready without it. Returns the fix and the ready report."""
    env = dict(env or lab.env)
    first = lab.multihost("check", "--plain", *argv, cwd=cwd, env=env)
    assert first.returncode == (3 if status == "FAIL" else 0), first.stdout + first.stderr
    fix = printed_fix(first.stdout, name, status)
    argv = follow(lab, fix, list(argv), env, cwd)
    again = lab.multihost("check", "--plain", *argv, cwd=cwd, env=env)
    assert again.returncode == 0 and again.stdout.splitlines()[-1].startswith("ready: "), \
        (fix, again.stdout, again.stderr)
    assert f": {name}: " not in again.stdout, again.stdout
    return fix, again.stdout


def test_a_busy_port_fix_gives_free_ports(lab, tmp_path):
    with on_host(lab, 2, LISTEN, "17001"):
        fix, _ = check_then_follow(lab, ["--hostfile", str(lab.hostfile)], "ports",
                                   str(tmp_path))
    assert fix.startswith("add `--start-port auto`")


def test_a_run_left_behind_is_stopped_by_its_fix(lab, tmp_path):
    hosts = hostfile(lab, tmp_path, 2)
    code = tmp_path / "code"
    code.mkdir()
    (code / "sleep.py").write_text(SLEEP)
    started = lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python", "--code",
                            str(code), "--no-check", "--detach", "--start-port", "17300",
                            "--log_dir", str(tmp_path / "log"), "--", "sleep.py", timeout=120)
    assert started.returncode == 0, started.stderr
    run_id = run_id_in(started.stdout)
    wait_running(lab, run_id, 2)
    # Still running: it holds the hosts (busy), and the fix stops one's own run.
    fix, _ = check_then_follow(lab, ["--hostfile", str(hosts)], "busy", str(tmp_path))
    assert fix.startswith(f"stop it: run `multihost stop {run_id}`")


@contextlib.contextmanager
def dataset(lab, path: str, odd: int) -> Iterator[None]:
    """The same small dataset on every host, one file different on host ``odd``."""
    for i in range(1, lab.n + 1):
        content = "other" if i == odd else "same"
        lab.ssh(i, f"mkdir -p {path} && echo {content} > {path}/a.txt && echo b > {path}/b.txt",
                check=True)
    try:
        yield
    finally:
        for i in range(1, lab.n + 1):
            lab.ssh(i, f"rm -rf {path}")


def test_a_differing_dataset_is_synced_on_the_same_hosts_by_its_fix(lab, tmp_path):
    with dataset(lab, "/root/fixdata", odd=3):
        fix, _ = check_then_follow(
            lab, ["--hostfile", str(lab.hostfile), "--data", "/root/fixdata"], "data",
            str(tmp_path))
        assert f"multihost sync --hostfile {lab.hostfile} --data /root/fixdata --sync-data" in fix
        assert lab.ssh(3, "cat /root/fixdata/a.txt").stdout.strip() == "same"


def test_a_system_directory_as_workdir_is_replaced_by_the_fixs_workdir(lab, tmp_path):
    fix, _ = check_then_follow(lab, ["--hostfile", str(lab.hostfile), "--workdir", "/etc"],
                               "workdir", str(tmp_path))
    assert fix == ("give the job a directory of its own: "
                   f"add `--workdir '~/multihost/{tmp_path.name}'`")


def test_gpus_asked_on_cpu_hosts_by_the_flag_run_on_cpu_with_as_many_processes(lab, tmp_path):
    fix, ready = check_then_follow(lab, ["--hostfile", str(lab.hostfile), "--gpus", "0,1"],
                                   "gpus", str(tmp_path))
    assert fix.startswith("to run on CPU, drop `--gpus` and add `--nproc_per_node 2`")
    assert "4 hosts" in ready.splitlines()[-1]


def test_more_cpu_processes_than_cpus_warn_and_the_fix_fits_them(lab, tmp_path):
    fix, _ = check_then_follow(lab, ["--hostfile", str(lab.hostfile), "--nproc_per_node", "64"],
                               "gpus", str(tmp_path), status="WARN")
    assert re.match(r"add `--nproc_per_node \d+` \(or fewer\)", fix), fix


def test_one_machine_listed_twice_is_left_out_by_its_fix(lab, tmp_path):
    hosts = tmp_path / "hosts.ini"
    hosts.write_text(lab.hostfile.read_text() + "\n[198.18.0.99]\n")
    with second_address(lab, 2, "198.18.0.99"):
        fix, ready = check_then_follow(lab, ["--hostfile", str(hosts)], "machine", str(tmp_path))
    assert fix.startswith("list each machine once: add `--exclude 198.18.0.99`")
    assert "4 hosts" in ready.splitlines()[-1]


def test_a_host_whose_python_lacks_torch_is_pointed_at_the_one_there_that_has_it(lab, tmp_path):
    hosts = tmp_path / "hosts.ini"
    hosts.write_text(lab.hostfile.read_text().replace(
        f"[{lab.address(4)}]", f"[{lab.address(4)}]\npython = /usr/bin/python3"))
    fix, _ = check_then_follow(lab, ["--hostfile", str(hosts)], "software", str(tmp_path))
    assert fix.startswith(f"add `--python {VENV_PYTHON}` (it has torch ")


def test_python_without_torch_everywhere_warns_and_names_the_one_that_has_it(lab, tmp_path):
    fix, _ = check_then_follow(lab, ["--hostfile", str(lab.hostfile), "--python",
                                     "/usr/bin/python3"], "software", str(tmp_path),
                               status="WARN")
    assert fix.startswith(f"add `--python {VENV_PYTHON}` (it has torch ")


def test_mixed_torch_versions_are_not_ready_and_the_fix_unmixes_them(lab, tmp_path):
    # Host 4's job python: a venv whose torch is an older version (its version file only).
    venv = "/root/oldtorch"
    site = f"{venv}/lib/python3.11/site-packages/torch"
    lab.ssh(4, f"/usr/bin/python3 -m venv --without-pip {venv} && mkdir -p {site} && "
               f"touch {site}/__init__.py && echo \"__version__ = '1.13.1+cpu'\" > "
               f"{site}/version.py", check=True)
    hosts = tmp_path / "hosts.ini"
    hosts.write_text(lab.hostfile.read_text().replace(
        f"[{lab.address(4)}]", f"[{lab.address(4)}]\npython = {venv}/bin/python"))
    try:
        first = lab.multihost("check", "--plain", "--hostfile", str(hosts), cwd=str(tmp_path))
        assert "torch differs: " in first.stdout and "1.13.1+cpu on 198.18.0.14" in first.stdout
        assert first.stdout.splitlines()[-1].startswith("NOT ready: 1 failed check on 1 host")
        fix, _ = check_then_follow(lab, ["--hostfile", str(hosts)], "software", str(tmp_path))
        assert fix.startswith(f"add `--python {VENV_PYTHON}`")
    finally:
        lab.ssh(4, f"rm -rf {venv}")


PADDLE_JOB = textwrap.dedent("""\
    import os
    print("trainer %s of %s" % (os.environ["PADDLE_TRAINER_ID"],
                                os.environ["PADDLE_TRAINERS_NUM"]), flush=True)
""")


def test_fleetrun_with_cuda_visible_devices_on_cpu_hosts_runs_once_it_is_unset(
        lab, tmp_path, paddle_python):
    # The reference's `export CUDA_VISIBLE_DEVICES=0,1; fleetrun train.py`, on CPU hosts.
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(PADDLE_JOB)
    argv = ["fleetrun", "--hostfile", str(hostfile(lab, tmp_path, 2)), "--python",
            paddle_python, "--code", str(code), "--plain", "--log_dir", str(tmp_path / "log"),
            "--start_port", "17280"]
    env = dict(lab.env, CUDA_VISIBLE_DEVICES="0,1")
    first = lab.multihost(*argv, "train.py", env=env, cwd=str(tmp_path), timeout=300)
    assert first.returncode == 3, first.stderr[-3000:]
    said = [line for line in first.stderr.splitlines() if ": gpus: no nvidia-smi" in line]
    fix = re.search(r"\(fix: (.*)\)$", said[0]).group(1)
    assert "--gpus" not in fix and fix.startswith("to run on CPU, run `unset CUDA_VISIBLE_DEVICES`")
    argv = follow(lab, fix, argv, env, str(tmp_path))
    done = lab.multihost(*argv, "train.py", env=env, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(re.findall(r"trainer (\d) of 4", done.stdout)) == ["0", "1", "2", "3"]
