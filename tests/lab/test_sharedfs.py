"""A user whose home every host shares (NFS homes), as that user: the job's python in a
venv in the shared home, the controller on a machine that shares it too. Runs in a row,
sync written once, rerun, logs, status, stop, fetch; a project on the shared filesystem
run in place; accounts whose login shell is tcsh, fish or zsh."""
from __future__ import annotations

import atexit
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from conftest import LabHandle, lab_unavailable, random_name
from multihost.lab import Lab
from multihost.lab.users import add_user, home_of, remove_user, shared_dir
from test_run import run_id_in

NAP = ("import os, socket, sys, time\n"
       "print('rank', os.environ.get('RANK'), 'on', socket.gethostname(), 'in', os.getcwd(),"
       " flush=True)\n"
       "open('out-%s.txt' % socket.gethostname(), 'w').write(sys.executable)\n"
       "time.sleep(float(os.environ.get('NAP', '0')))\n")


class SharedUser:
    """An ordinary user of the lab whose home is one directory on every host; its
    multihost runs as itself, on a controller that sees the same home."""

    def __init__(self, lab: LabHandle, name: str):
        self.lab, self.name = lab, name
        self.home = home_of(lab.lab.paths, name)
        self.hosts = self.home / "hosts.ini"

    def as_user(self, argv):
        return ["runuser", "-u", self.name, "--", "env", f"HOME={self.home}", *argv]

    def argv(self, *args: str):
        return self.as_user(self.command(*args))

    def command(self, *args: str):
        """`multihost ARGS` of this checkout, as this user can start it."""
        # This interpreter may live where the user can not read (a pyenv under /root):
        # the system's python3 of the same version runs this checkout with its packages.
        python = sys.executable if not str(Path(sys.executable).resolve()).startswith("/root") \
            else "/usr/bin/python3"
        start = ("import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); "
                 "sys.argv[0] = 'multihost'; runpy.run_module('multihost', run_name='__main__')")
        return [python, "-c", start, sysconfig.get_paths()["purelib"], *args]

    def multihost(self, *args: str, cwd=None, timeout: float = 180):
        return self.lab.run(self.argv(*args), timeout=timeout, cwd=str(cwd or self.home))

    def write(self, relative: str, text: str) -> Path:
        path = self.home / relative
        self.lab.run(self.as_user(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"',
                                   "w", str(path)]), input=text, check=True)
        return path

    def venv(self) -> str:
        """The job's python: a venv in the shared home (no torch: --launcher python)."""
        python = self.home / "venv" / "bin" / "python"
        if not python.exists():
            self.lab.run(self.as_user(["/usr/bin/python3", "-m", "venv", "--without-pip",
                                       str(self.home / "venv")]), check=True, timeout=120)
        return str(python)


@pytest.fixture(scope="module")
def shared():
    reason = lab_unavailable()
    if reason:
        pytest.skip(f"no lab on this machine: {reason}")
    the_lab = Lab(random_name("mhs"))
    atexit.register(the_lab.down)
    the_lab.up(3, shared_home=random_name("mha"))
    handle = LabHandle(the_lab, 3)
    handle.users = []   # more accounts, removed once the lab (and their processes) is gone
    try:
        yield handle
    finally:
        the_lab.down()
        atexit.unregister(the_lab.down)
        for name in handle.users:
            remove_user(name)


@pytest.fixture(scope="module")
def alice(shared):
    user = SharedUser(shared, shared.lab.state().shared_user)
    python = user.venv()
    user.hosts.write_text(user.hosts.read_text().replace("/usr/bin/python3", python))
    user.write("code/nap.py", NAP)
    return user


def run(user, *extra, code="code", nap="0"):
    return user.multihost("run", "--hostfile", str(user.hosts), "--launcher", "python",
                          "--plain", "--env", f"NAP={nap}", *extra, "--", "nap.py",
                          cwd=user.home / code)


def test_three_runs_in_a_row_each_host_keeping_its_own_state(alice):
    for _ in range(3):
        result = run(alice)
        assert result.returncode == 0, result.stderr
        ranks = sorted(line.split("rank ")[1][:1] for line in result.stdout.splitlines()
                       if "rank " in line)
        assert ranks == ["0", "1", "2"], result.stdout
    state = alice.home / ".multihost"
    owner = (state / "host").read_text().strip()
    others = sorted(p.name for p in (state / "hosts").iterdir())
    assert len(others) == 2 and owner not in others
    run_id = run_id_in(result.stderr)
    for where in [state] + [state / "hosts" / name for name in others]:
        assert (where / "runs" / run_id / "node.json").exists(), where


def test_sync_writes_a_shared_workdir_once_and_check_says_it_is_shared(alice):
    for i in range(300):
        alice.write(f"tree/pkg{i % 10}/m{i}.py", f"VALUE = {i}\n" * 50)
    synced = alice.multihost("sync", "--hostfile", str(alice.hosts), "--plain",
                             cwd=alice.home / "tree")
    assert synced.returncode == 0, synced.stderr
    said = (synced.stdout + synced.stderr).splitlines()
    written = [line for line in said if re.fullmatch(r"\S+: 300 files \(.*\) written", line)]
    shares = [line for line in said if
              f"up to date (shares the workdir of {alice.lab.address(1)}: written there once" in line]
    assert len(written) == 1 and len(shares) == 2, said
    # checked once, from the second host; the third is counted as verified by that check
    assert any(re.fullmatch(rf"3 hosts share \S+: written once by {re.escape(alice.lab.address(1))}, "
                            rf"checked from {re.escape(alice.lab.address(2))}", line)
               for line in said), said
    # a file removed here goes there once, and nothing races
    (alice.home / "tree" / "pkg0" / "m0.py").unlink()
    again = alice.multihost("sync", "--hostfile", str(alice.hosts), "--plain",
                            cwd=alice.home / "tree")
    assert again.returncode == 0, again.stderr
    assert not (alice.home / "multihost" / "tree" / "pkg0" / "m0.py").exists()
    checked = alice.multihost("check", "--hostfile", str(alice.hosts), "--json",
                              cwd=alice.home / "tree")
    doc = json.loads(checked.stdout)
    assert [g["hosts"] for g in doc["shared_workdirs"]] == [alice.lab.addresses], doc
    plain = alice.multihost("check", "--hostfile", str(alice.hosts), "--plain",
                            cwd=alice.home / "tree")
    assert "workdir: one directory shared by 3 hosts" in plain.stdout, plain.stdout


def test_status_logs_stop_rerun_and_fetch_of_a_detached_run(alice):
    started = run(alice, "--detach", nap="120")
    assert started.returncode == 0, started.stderr
    run_id = run_id_in(started.stdout + started.stderr)
    deadline = time.monotonic() + 60
    while True:
        status = alice.multihost("status", run_id, "--json")
        doc = json.loads(status.stdout)
        if [n["state"] for n in doc["nodes"]] == ["running"] * 3:
            break
        assert time.monotonic() < deadline, doc
        time.sleep(0.5)
    logs = alice.multihost("logs", run_id, "--plain")
    assert logs.returncode == 0, logs.stderr
    assert all(f"rank {r} on" in logs.stdout for r in "012"), logs.stdout
    stopped = alice.multihost("stop", run_id, "--kill-wait", "1")
    assert stopped.returncode == 0, stopped.stderr
    doc = json.loads(alice.multihost("status", run_id, "--json").stdout)
    assert {n["state"] for n in doc["nodes"]} == {"stopped"}, doc
    fetched = alice.multihost("fetch", "--run", run_id, "--all", "--to",
                              str(alice.home / "got"), "out-h2.txt")
    assert fetched.returncode == 0, fetched.stderr
    got = sorted((alice.home / "got").glob("*/out-h2.txt"))
    assert len(got) == 3 and got[0].read_text().endswith("venv/bin/python"), got
    again = alice.multihost("rerun", run_id, "--plain", "--env", "NAP=0",
                            cwd=alice.home / "code")
    assert again.returncode == 0, again.stderr


FAILS_ONCE = ("import os, sys\n"
              "if os.environ.get('RANK') == '1' and not os.path.exists('failed-once'):\n"
              "    open('failed-once', 'w').close()\n"
              "    sys.exit(3)\n"
              "print('rank', os.environ.get('RANK'), 'attempt ok', flush=True)\n")


def test_a_restart_and_a_queued_run_with_a_shared_home(alice):
    alice.write("restart/once.py", FAILS_ONCE)
    restarted = alice.multihost("run", "--hostfile", str(alice.hosts), "--launcher", "python",
                                "--plain", "--max-restarts", "1", "--kill-wait", "1", "--",
                                "once.py", cwd=alice.home / "restart")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    # rank 1 failed the first attempt; the second ran all three
    assert restarted.stdout.count("rank 1 attempt ok") == 1, restarted.stdout
    assert "attempt_1" in restarted.stderr, restarted.stderr
    holder = run(alice, "--detach", "--name", "holder", nap="15")
    assert holder.returncode == 0, holder.stderr
    queued = alice.multihost("run", "--hostfile", str(alice.hosts), "--launcher", "python",
                             "--plain", "--queue", "--name", "waiter", "--env", "NAP=0", "--",
                             "nap.py", cwd=alice.home / "code", timeout=240)
    assert queued.returncode == 0, queued.stderr[-3000:]
    assert "queued: 1st, behind" in queued.stderr and "holder" in queued.stderr, queued.stderr

def test_a_project_on_the_shared_filesystem_runs_in_place(alice):
    project = alice.write("proj/nap.py", NAP).parent
    result = alice.multihost("run", "--hostfile", str(alice.hosts), "--launcher", "python",
                             "--plain", "--", "nap.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0].endswith(
        f"code: {project} is the same directory on all 3 hosts: no copy"), result.stderr
    assert sorted(p.name for p in project.glob("out-*.txt")) == ["out-h1.txt", "out-h2.txt",
                                                                 "out-h3.txt"]
    assert not (alice.home / "multihost" / "proj").exists()
    assert not (project / ".multihost-share").exists()


# What only that shell reads: `exec` runs a line in the user's own login shell, as ssh does.
OWN_SYNTAX = {"tcsh": ("set x = tcsh; echo $x", "tcsh"),
              "fish": ("set x fish; echo $x", "fish"),
              "zsh": ("x=(z s h); echo ${(j::)x}", "zsh")}


@pytest.mark.parametrize("shell", ["tcsh", "fish", "zsh"])
def test_an_account_whose_login_shell_is_not_bash_checks_execs_runs_and_stops(shared, shell):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed (scripts/setup.sh installs it)")
    name = random_name("mh" + shell[0])
    shared.users.append(name)
    add_user(shared.lab.paths, name, 3, shell=shell)
    user = SharedUser(shared, name)
    user.write("code/nap.py", NAP)
    checked = user.multihost("check", "--hostfile", str(user.hosts), "--plain",
                             cwd=user.home / "code")
    said = checked.stdout + checked.stderr
    assert checked.returncode == 0 and "ready: 3 hosts" in checked.stdout, said
    line, said = OWN_SYNTAX[shell]
    executed = user.multihost("exec", "--hostfile", str(user.hosts), "--plain", "--", line)
    assert executed.returncode == 0, executed.stderr
    assert executed.stdout.count(said) == 3, executed.stdout
    done = run(user)
    assert done.returncode == 0, done.stderr
    started = run(user, "--detach", nap="120")
    assert started.returncode == 0, started.stderr
    run_id = run_id_in(started.stdout + started.stderr)
    deadline = time.monotonic() + 60
    while [n["state"] for n in json.loads(
            user.multihost("status", run_id, "--json").stdout)["nodes"]] != ["running"] * 3:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    logs = user.multihost("logs", run_id, "--plain")
    assert all(f"rank {r} on" in logs.stdout for r in "012"), logs.stdout + logs.stderr
    stopped = user.multihost("stop", run_id, "--kill-wait", "1")
    assert stopped.returncode == 0, stopped.stderr
    doc = json.loads(user.multihost("status", run_id, "--json").stdout)
    assert {n["state"] for n in doc["nodes"]} == {"stopped"}, doc


def test_a_python_the_user_may_not_execute_is_named_with_a_fix_that_works(alice, tmp_path):
    closed = alice.home.parent.parent / random_name("closed")   # root's, mode 700
    closed.mkdir(mode=0o700)
    (closed / "python3").symlink_to("/usr/bin/python3")
    hosts = alice.home / "denied.ini"
    hosts.write_text(alice.hosts.read_text().replace(
        f"python = {alice.venv()}", f"python = {closed / 'python3'}"))
    try:
        result = alice.multihost("run", "--hostfile", str(hosts), "--launcher", "python",
                                 "--no-check", "--plain", "--", "nap.py", cwd=alice.home / "code")
        line = result.stderr.strip().splitlines()[-1]
        assert result.returncode != 0
        assert f"{closed / 'python3'}: Permission denied: {alice.name} may not execute it" in line
        fix = re.search(r"\(fix: `([^`]+)` shows which", line).group(1)
        typed = alice.lab.run(alice.as_user(shlex.split(fix)))   # the fix, typed as is
        assert "python3 - Permission denied" in typed.stdout and f"drwx------ root" in typed.stdout
    finally:
        shutil.rmtree(closed)


@pytest.fixture(scope="module")
def over_sshfs():
    """A lab whose user's home is an sshfs mount on every host, served by host 1."""
    reason = lab_unavailable()
    if reason or shutil.which("sshfs") is None or not os.path.exists("/dev/fuse"):
        pytest.skip(f"no sshfs lab on this machine: {reason or 'sshfs or /dev/fuse missing'}")
    the_lab = Lab(random_name("mhf"))
    atexit.register(the_lab.down)
    name = random_name("mhf")
    the_lab.up(3, shared_home=name, sshfs=True)
    try:
        yield LabHandle(the_lab, 3), shared_dir(the_lab.paths) / "sshfs" / name
    finally:
        the_lab.down()
        atexit.unregister(the_lab.down)


def test_over_sshfs_runs_in_a_row_and_a_sync_written_once(over_sshfs, tmp_path):
    lab, files = over_sshfs
    code = tmp_path / "code"
    code.mkdir()
    (code / "nap.py").write_text(NAP)
    for i in range(200):
        (code / f"m{i}.py").write_text(f"VALUE = {i}\n" * 40)
    hosts = str(files / "hosts.ini")
    for _ in range(3):
        result = lab.multihost("run", "--hostfile", hosts, "--launcher", "python", "--plain",
                               "--code", str(code), "--", "nap.py", timeout=300)
        assert result.returncode == 0, result.stderr
    said = lab.multihost("sync", "--hostfile", hosts, "--plain", "--code", str(code),
                         "--workdir", "~/again", timeout=300)
    assert said.returncode == 0, said.stderr
    assert said.stdout.count(f"shares the workdir of {lab.address(1)}") == 2, said.stdout
    assert f"written once by {lab.address(1)}, checked from {lab.address(2)}" in said.stdout
    assert re.search(rf"^{re.escape(lab.address(1))}: 201 files \(.*\) written", said.stdout, re.M)
    state = files / ".multihost"
    assert len(list((state / "hosts").iterdir())) == 2 and (state / "host").exists()


@pytest.fixture(scope="module")
def slurm_shared():
    """A Slurm lab (slurmctld on ctl, slurmd on h1 and h2) whose user's home is shared."""
    reason = lab_unavailable() or next(
        (f"`{tool}` is not installed (slurm-wlm, munge)" for tool in ("slurmctld", "slurmd", "munged")
         if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin")), None)
    if reason:
        pytest.skip(f"no Slurm lab on this machine: {reason}")
    the_lab = Lab(random_name("mhs"))
    atexit.register(the_lab.down)
    the_lab.up(2, with_slurm=True, shared_home=random_name("mhu"))
    try:
        handle = LabHandle(the_lab, 2)
        yield SharedUser(handle, the_lab.state().shared_user)
    finally:
        the_lab.down()
        atexit.unregister(the_lab.down)


def test_runs_in_a_slurm_allocation_whose_nodes_share_the_home_run_in_place(slurm_shared):
    user = slurm_shared
    project = user.write("code/nap.py", NAP).parent
    for _ in range(2):   # the second one met "listed twice" on h2
        result = user.lab.run(user.as_user(["salloc", "-N", "2", *user.command(
            "run", "--launcher", "python", "--plain", "--", "nap.py")]), cwd=str(project),
            timeout=240)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "is the same directory on all 2 hosts: no copy" in result.stderr, result.stderr
    assert sorted(p.name for p in project.glob("out-*.txt")) == ["out-h1.txt", "out-h2.txt"]
    assert not (user.home / "multihost").exists()


def one_host_file(files: Path, i: int, into: Path) -> Path:
    """A hostfile of the shared home's hostfile's defaults and its host ``i`` only."""
    lines = (files / "hosts.ini").read_text().splitlines()
    head = lines[:lines.index(next(line for line in lines if line.startswith("[198.")))]
    into.write_text("\n".join(head + [f"[{lines[len(head) + i - 1][1:-1]}]"]) + "\n")
    return into


def test_over_sshfs_a_sync_from_another_host_is_refused_naming_the_holder(over_sshfs, tmp_path):
    """sshfs has no lock across clients: two syncs into one shared workdir through two
    hosts met each other only by luck. The first names its host in the lock's exclusively
    created file; the second, younger, is refused at once naming it."""
    lab, files = over_sshfs
    big, small = tmp_path / "big", tmp_path / "small"
    for i in range(1500):
        (big / f"pkg{i % 15}").mkdir(parents=True, exist_ok=True)
        (big / f"pkg{i % 15}" / f"m{i}.py").write_text(f"VALUE = {i}\n" * 40)
    small.mkdir()
    (small / "other.py").write_text("print('another tree')\n")
    held = files / "held.multihost-lock.host"
    first = lab.popen([sys.executable, "-m", "multihost", "sync", "--plain", "--code", str(big),
                       "--hostfile", str(one_host_file(files, 2, tmp_path / "h2.ini")),
                       "--workdir", "~/held"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True)
    try:
        deadline = time.monotonic() + 120
        text = ""
        while not text and first.poll() is None and time.monotonic() < deadline:
            text = held.read_text() if held.exists() else ""   # made, then written
            time.sleep(0.05)
        assert text, first.communicate(timeout=60)
        holder = json.loads(text)
        second = lab.multihost("sync", "--plain", "--code", str(small), "--hostfile",
                               str(one_host_file(files, 3, tmp_path / "h3.ini")),
                               "--workdir", "~/held", timeout=120)
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, out + err
    said = second.stdout + second.stderr
    assert second.returncode != 0 and "is being written by" in said, said
    assert f"(pid {holder['pid']} on {holder['host']})" in said, said
    assert f"rm {Path('/run/multihost-sshfs') / files.name / 'held.multihost-lock.host'}" in said
    assert not held.exists()              # the first gave its hold back
    assert not (files / "held" / "other.py").exists()
    assert len(list((files / "held").rglob("m*.py"))) == 1500
