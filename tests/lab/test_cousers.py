"""Another account on the same hosts (eve: a co-worker, a student, a stolen login) can plant
directories, links and files in the places everyone may write (/tmp), and nothing she
plants turns multihost against the user who runs it: a workdir or log directory of hers
is refused naming her and its mode, a link she put where a lock goes is never followed,
and the hosts' registry of runs is one she can neither own nor hide. The suite runs
where the kernel follows links in sticky directories (fs.protected_symlinks=0, as in
many containers): the fixture makes sure of that and puts the setting back."""
from __future__ import annotations

import os
import pwd
import secrets
import subprocess
from pathlib import Path

import pytest

from test_run import hostfile, run_id_in
from test_sharing import SHORT, go  # noqa: F401 (a fixture)

CODE = "import os\nprint('ran as uid', os.getuid(), flush=True)\n"


class Eve:
    """A second unix user, in the passwd every lab host shares; she needs no login: what
    she plants, she plants from inside a host (runuser), as she would from her shell."""

    def __init__(self, lab):
        self.lab, self.name = lab, "mhe" + secrets.token_hex(3)
        subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", "-p", "*",
                        self.name], check=True)
        self.uid = pwd.getpwnam(self.name).pw_uid

    def on(self, i: int, script: str) -> None:
        """Run ``script`` (sh) as her inside host ``i``."""
        done = self.lab.host_run(i, ["runuser", "-u", self.name, "--", "sh", "-c",
                                     "umask 000; " + script])
        assert done.returncode == 0, done.stderr

    def remove(self) -> None:
        subprocess.run(["userdel", self.name], check=False)


@pytest.fixture(scope="module", autouse=True)
def links_followed_in_sticky_dirs():
    """fs.protected_symlinks=0: a link in /tmp is followed whoever made it."""
    path = Path("/proc/sys/fs/protected_symlinks")
    before = path.read_text().strip()
    path.write_text("0")
    yield
    path.write_text(before)


@pytest.fixture
def eve(lab):
    user = Eve(lab)
    try:
        yield user
    finally:
        user.remove()


@pytest.fixture
def code(tmp_path):
    directory = tmp_path / "code"
    directory.mkdir()
    (directory / "nap.py").write_text(CODE)
    (directory / "sleep.py").write_text(SHORT)     # until $GO is made, or $NAP seconds
    return directory


def one_host(lab, tmp_path, *args: str, command: str = "run", script: str = "nap.py"):
    extra = ("--launcher", "python", "--plain") if command == "run" else ()
    tail = ("--", script) if command == "run" else ()
    return lab.multihost(command, "--hostfile", str(hostfile(lab, tmp_path, 1)), *extra, *args,
                         *tail, timeout=180)


def host_ls(lab, i: int, path: str) -> str:
    return lab.host_run(i, ["sh", "-c", f"ls -A {path} 2>&1"]).stdout


def test_a_workdir_another_user_owns_and_anyone_may_write_is_refused_by_sync_run_and_check(
        lab, tmp_path, code, eve):
    job = f"/tmp/job-{secrets.token_hex(3)}"
    eve.on(1, f"mkdir -m 777 {job}")
    named = f"{job} belongs to {eve.name} (mode 0777)"
    synced = one_host(lab, tmp_path, "--code", str(code), "--workdir", job, command="sync")
    assert synced.returncode != 0 and named in synced.stderr, synced.stderr
    assert host_ls(lab, 1, job) == ""          # nothing of ours was written into her directory
    ran = one_host(lab, tmp_path, "--code", str(code), "--workdir", job, "--no-sync", "--no-check")
    assert ran.returncode != 0 and named in ran.stderr, ran.stderr
    assert "ran as uid" not in ran.stdout + ran.stderr
    checked = one_host(lab, tmp_path, "--code", str(code), "--workdir", job, command="check")
    said = checked.stdout + checked.stderr
    assert checked.returncode != 0 and named in said and "not only yours" in said, said
    assert "chmod" not in said                  # never a fix that touches her directory


def test_a_workdir_that_is_a_link_another_user_planted_is_refused_naming_her(
        lab, tmp_path, code, eve):
    job, hers = f"/tmp/job-{secrets.token_hex(3)}", f"/tmp/hers-{secrets.token_hex(3)}"
    eve.on(1, f"mkdir -m 755 {hers} && ln -s {hers} {job}")
    synced = one_host(lab, tmp_path, "--code", str(code), "--workdir", job, command="sync")
    assert synced.returncode != 0, synced.stderr
    assert f"{job} is a link made by {eve.name} (to {hers})" in synced.stderr
    assert host_ls(lab, 1, hers) == ""


def test_a_log_dir_of_another_user_or_of_the_system_is_refused_before_anything_starts(
        lab, tmp_path, code, eve):
    hers = tmp_path / "shared-log"
    hers.mkdir()
    os.chown(hers, eve.uid, -1)
    hers.chmod(0o777)
    refused = one_host(lab, tmp_path, "--code", str(code), "--log_dir", str(hers))
    assert refused.returncode != 0, refused.stderr
    assert f"--log_dir {hers} is not only yours" in refused.stderr
    assert f"belongs to {eve.name} (mode 0777)" in refused.stderr
    system = one_host(lab, tmp_path, "--code", str(code), "--log_dir", "/etc")
    assert system.returncode != 0 and "--log_dir /etc is a system directory" in system.stderr
    assert "ran as uid" not in refused.stdout + system.stdout


def test_a_lock_link_planted_where_the_workdir_lock_goes_is_never_followed(
        lab, tmp_path, code, eve):
    job = f"/tmp/job-{secrets.token_hex(3)}"
    victim = f"/root/victim-{secrets.token_hex(3)}"
    lab.host_run(1, ["sh", "-c", f"echo precious > {victim}"], check=True)
    eve.on(1, f"ln -s {victim} {job}.multihost-lock")
    try:
        synced = one_host(lab, tmp_path, "--code", str(code), "--workdir", job, command="sync")
        assert synced.returncode == 0, synced.stderr
        assert lab.host_run(1, ["cat", victim]).stdout == "precious\n"
        ran = one_host(lab, tmp_path, "--code", str(code), "--workdir", job)
        assert ran.returncode == 0 and "ran as uid 0" in ran.stdout + ran.stderr, ran.stderr
        assert lab.host_run(1, ["cat", victim]).stdout == "precious\n"
    finally:
        lab.host_run(1, ["rm", "-rf", victim, job, f"{job}.multihost-lock"])


def test_a_run_in_place_leaves_no_lock_in_the_parent_directory(lab, tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "nap.py").write_text(CODE)
    done = lab.multihost("run", "--launcher", "python", "--plain", "--allow-concurrent", "--",
                         "nap.py", cwd=str(project))
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "proj.multihost-lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]


# -- the hosts' registry of runs (/tmp/multihost-holds) -------------------------------------
REGISTRY = "/tmp/multihost-holds"


@pytest.fixture
def bare_registry(lab):
    """Host 1 without a registry (eve gets to plant first); root's own made again after."""
    lab.host_run(1, ["rm", "-rf", REGISTRY], check=True)
    yield
    lab.host_run(1, ["rm", "-rf", REGISTRY], check=True)


def test_a_registry_link_planted_by_another_user_fails_no_run_and_no_fix_opens_its_target(
        lab, tmp_path, code, eve, bare_registry):
    target = f"/root/target-{secrets.token_hex(3)}"
    lab.host_run(1, ["mkdir", "-m", "700", target], check=True)
    eve.on(1, f"ln -s {target} {REGISTRY}")
    try:
        ran = one_host(lab, tmp_path, "--code", str(code))
        assert ran.returncode == 0 and "ran as uid 0" in ran.stdout + ran.stderr, ran.stderr
        checked = one_host(lab, tmp_path, "--code", str(code), command="check")
        said = checked.stdout + checked.stderr
        assert f"{REGISTRY} is a link of {eve.name}" in said and "not root's: not used" in said
        assert f"rm -rf {REGISTRY} && mkdir -m 1777 {REGISTRY}" in said and "chmod" not in said
        mode = lab.host_run(1, ["stat", "-c", "%a %U", target]).stdout.split()
        assert mode == ["700", "root"] and host_ls(lab, 1, target) == ""
    finally:
        lab.host_run(1, ["rm", "-rf", target])


def test_a_registry_directory_another_user_made_first_is_not_used_so_she_can_not_hide_a_run(
        lab, tmp_path, code, eve, bare_registry, go):
    eve.on(1, f"mkdir -m 1777 {REGISTRY}")
    first = one_host(lab, tmp_path, "--code", str(code), "--detach", "--env", f"GO={go}",
                     "--env", "NAP=120", "--name", "roots", script="sleep.py")
    assert first.returncode == 0, first.stderr
    try:
        assert f"{REGISTRY} is a directory of {eve.name} (mode 1777), not root's" in first.stderr
        assert host_ls(lab, 1, REGISTRY) == ""   # nothing of root's for her to delete
        second = one_host(lab, tmp_path, "--code", str(code), "--no-check")
        assert second.returncode != 0 and 'busy: root\'s run "roots"' in second.stderr, \
            second.stderr
    finally:
        lab.multihost("stop", run_id_in(first.stdout), "--kill-wait", "1", timeout=60)


def test_junk_and_forged_entries_neither_hide_a_run_nor_hold_a_host(lab, tmp_path, code, eve, go):
    first = one_host(lab, tmp_path, "--code", str(code), "--detach", "--env", f"GO={go}",
                     "--env", "NAP=120", "--name", "roots", script="sleep.py")
    assert first.returncode == 0, first.stderr
    # 2,001 names sorted before every entry's, and an entry of hers that names pid 1 (alive
    # for ever), a time far ahead, and a newline that would print a row of her making
    forged = ('{"kind": "run", "run_id": "20261127-110200-ab12", "pid": 1, "time": 9e9, '
              '"name": "x\\nroot  20261127-999999-0000  running"}')
    mine = f"{REGISTRY}/run-{eve.uid}-20261127-110200-ab12.json"
    eve.on(1, f"i=0; while [ $i -le 2000 ]; do : > {REGISTRY}/a$i; i=$((i+1)); done; "
              f"printf '%s' '{forged}' > {mine}")
    try:
        checked = one_host(lab, tmp_path, "--code", str(code), command="check")
        said = checked.stdout + checked.stderr
        assert checked.returncode != 0 and 'root\'s run "roots"' in said, said
        assert "kill" not in said, said
        listed = lab.multihost("status", "--all", "--hostfile", str(hostfile(lab, tmp_path, 1)),
                               timeout=60)
        assert listed.returncode == 0, listed.stderr
        rows = listed.stdout.splitlines()
        assert any("roots" in row for row in rows), listed.stdout
        # a name no run can have is no name: no row of her making
        assert not any("999999" in row for row in rows), listed.stdout
    finally:
        lab.multihost("stop", run_id_in(first.stdout), "--kill-wait", "1", timeout=60)
        lab.host_run(1, ["sh", "-c", f"rm -f {REGISTRY}/a* {mine}"])



def test_an_entry_of_another_user_naming_pid_1_or_a_future_time_holds_nothing(
        lab, tmp_path, code, eve):
    run_id = "20261127-110200-ab13"
    forged = f'{{"kind": "run", "run_id": "{run_id}", "pid": 1, "time": 9e9}}'
    hers = f"{REGISTRY}/run-{eve.uid}-{run_id}.json"
    lab.host_run(1, ["sh", "-c", f"mkdir -p -m 1777 {REGISTRY}"], check=True)
    eve.on(1, f"printf '%s' '{forged}' > {hers}")
    try:
        ran = one_host(lab, tmp_path, "--code", str(code))
        assert ran.returncode == 0 and "ran as uid 0" in ran.stdout + ran.stderr, ran.stderr
    finally:
        lab.host_run(1, ["rm", "-f", hers])


# -- fetch: what a host holds never becomes an option, a way out, or a flood ---------------
def test_fetch_refuses_links_out_of_the_workdir_and_over_the_bound_and_takes_no_option(
        lab, tmp_path, code, eve):
    job = f"/root/fetch-{secrets.token_hex(3)}"
    ran = one_host(lab, tmp_path, "--code", str(code), "--workdir", job)
    assert ran.returncode == 0, ran.stderr
    run = run_id_in(ran.stdout + ran.stderr)
    hers = f"/tmp/hers-{secrets.token_hex(3)}"
    eve.on(1, f"mkdir -m 755 {hers} && echo hers > {hers}/secret.txt")
    lab.host_run(1, ["sh", "-c", f"cd {job} && ln -s {hers} out && ln -s {hers}/secret.txt top "
                                 "&& truncate -s 2G sparse.bin"], check=True)
    try:
        got = tmp_path / "got"
        for path in ("top", "out/secret.txt"):
            done = lab.multihost("fetch", run, path, "--to", str(got), timeout=60)
            assert done.returncode != 0, done.stdout
            assert f"{path} leads out of the run's workdir {job} (to {hers}" in done.stderr
        assert not got.exists() or not any(got.rglob("secret.txt"))
        big = lab.multihost("fetch", run, "sparse.bin", "--to", str(got), "--limit", "1G",
                            timeout=60)
        assert big.returncode != 0 and "holds 2.0 GiB" in big.stderr, big.stderr
        assert "over the fetch bound of 1.0 GiB" in big.stderr and "--limit 4G" in big.stderr
        sneaky = '--rsh=sh -c "touch PWNED" x'
        done = lab.multihost("fetch", run, "nap.py", "--to", sneaky, timeout=60,
                             cwd=str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert not (tmp_path / "PWNED").exists()
        assert (tmp_path / sneaky / "nap.py").read_text() == CODE
    finally:
        lab.host_run(1, ["rm", "-rf", job, hers])


# -- what is shown and linked ---------------------------------------------------------------
def test_log_latest_is_replaced_only_when_it_is_a_link_and_nothing_is_left_beside_it(
        lab, tmp_path, code):
    for kind in ("file", "dir"):
        log = tmp_path / f"log-{kind}"
        log.mkdir()
        latest = log / "latest"
        latest.mkdir() if kind == "dir" else latest.write_text("my notes\n")
        ran = one_host(lab, tmp_path, "--code", str(code), "--log_dir", str(log))
        assert ran.returncode == 0, ran.stderr
        assert f"log/latest not updated: {latest} is a {'directory' if kind == 'dir' else 'file'}" \
            f", not a link: kept as it is" in ran.stdout + ran.stderr
        assert kind == "dir" or latest.read_text() == "my notes\n"
        assert not [p for p in log.iterdir() if p.name.startswith(".latest")]


def test_an_address_in_fullwidth_digits_is_refused_before_any_connection(lab, tmp_path):
    look_alike = lab.address(1).replace("198", "\uff11\uff19\uff18")
    done = lab.multihost("check", "--ips", look_alike, "--plain", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "has a character that is not ASCII ('\uff11', U+FF11)" in done.stderr
    long_name = lab.multihost("run", "--ips", lab.address(1), "--name", "a" * 10000 + "!",
                              "--", "nap.py", timeout=60)
    assert long_name.returncode == 2 and "(10001 characters) is not a plain word" in long_name.stderr
    assert len(long_name.stderr) < 400


def _descendants(pid: int):
    found, todo = [], [pid]
    while todo:
        here = todo.pop()
        for task in Path(f"/proc/{here}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                kids = []
            found += kids
            todo += kids
    return found


def test_a_queued_run_ended_by_sigterm_leaves_the_line_at_once(lab, tmp_path, code, go):
    import json
    import signal
    import sys
    import time

    hosts = hostfile(lab, tmp_path, 1)
    first = one_host(lab, tmp_path, "--code", str(code), "--detach", "--env", f"GO={go}",
                     "--env", "NAP=120", "--name", "holder", script="sleep.py")
    assert first.returncode == 0, first.stderr

    def queued():
        listed = lab.multihost("status", "--all", "--hostfile", str(hosts), "--json", timeout=60)
        return [r for r in json.loads(listed.stdout)["runs"]
                if r["name"] == "waiter" and r["state"] == "queued"]

    waiting = lab.popen([sys.executable, "-m", "multihost", "run", "--hostfile", str(hosts),
                         "--launcher", "python", "--code", str(code), "--name", "waiter",
                         "--queue", "--plain", "--", "nap.py"], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not queued():
            assert time.monotonic() < deadline and waiting.poll() is None
            time.sleep(0.5)
        controller = [p for p in [waiting.pid] + _descendants(waiting.pid)
                      if b"waiter" in Path(f"/proc/{p}/cmdline").read_bytes()
                      and b"multihost" in Path(f"/proc/{p}/cmdline").read_bytes()][-1]
        os.kill(controller, signal.SIGTERM)
        waiting.communicate(timeout=60)
        assert not queued()      # out of the line at once (it held its place for 60 s)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
        lab.multihost("stop", run_id_in(first.stdout + first.stderr), "--kill-wait", "1",
                      timeout=60)
