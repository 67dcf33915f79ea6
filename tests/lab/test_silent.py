"""Nothing silently wrong (issue 26): a launch that never completed, a host whose python
hangs or whose shell ends early, a full run directory, and what a user names on the
command line, each tried for real in the lab.

Every run here carries its run id in every process it starts, so "nothing left" is
checked on each host's whole process table (test_faults.SCAN).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from test_faults import Controller, found_on, ips, on_host, run_argv, wait_for

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def code(tmp_path: Path) -> Path:
    directory = tmp_path / f"silent-{secrets.token_hex(3)}"   # its own workdir on hosts
    directory.mkdir()
    (directory / "sleeper.py").write_text(SLEEPER)
    return directory


def record_of(lab, run_id: str) -> dict:
    path = lab.home / ".multihost" / "runs" / run_id / "run.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def slow_launch_python(lab, i: int, name: str, seconds: float) -> str:
    """A python for host i whose `run.launch` helper operation starts ``seconds`` late
    (everything else it runs at once): the controller is caught between two launches."""
    path = f"/root/{name}"
    on_host(lab, i, path).write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in *run.launch*) sleep {seconds};; esac
        exec {sys.executable} "$@"
        """))
    on_host(lab, i, path).chmod(0o755)
    return path


# -- 5: a launch either completes on every node or is undone -----------------------------
@pytest.mark.parametrize("launched", [1, 2, 3])
def test_a_controller_killed_mid_launch_leaves_nothing_and_status_says_why(lab, code, tmp_path,
                                                                          launched):
    name = f"slowpy-{secrets.token_hex(3)}"
    lines = []
    for i in range(1, 5):
        lines.append(f"[{lab.address(i)}]")
        # The hosts after the first `launched` are still on their way when it dies.
        python = slow_launch_python(lab, i, name, 6) if i > launched else sys.executable
        lines.append(f"python = {python}")
    hostfile = tmp_path / "hosts.ini"
    hostfile.write_text("\n".join(lines) + "\n")
    argv = run_argv(lab, code, 4, "--launch-timeout", "5")
    argv[argv.index("--ips"):argv.index("--ips") + 2] = ["--hostfile", str(hostfile)]
    del argv[argv.index("--python"):argv.index("--python") + 2]
    controller = Controller(lab, argv + ["--", "sleeper.py"])
    try:
        run_id = controller.run_id()
        wait_for(lambda: sum(n.get("state") == "running"
                             for n in record_of(lab, run_id).get("nodes", [])) >= launched,
                 60, "the first nodes never launched")
        killed = time.monotonic()
        controller.kill()
        assert sum(n.get("state") == "running" for n in record_of(lab, run_id)["nodes"]) == launched
        # Within the bounded time (5 s, the grace, the late launches' 6 s): nothing left.
        wait_for(lambda: not found_on(lab, range(1, 5), run_id), 60,
                 "the run's processes were left on the hosts")
        assert time.monotonic() - killed < 45
        status = lab.multihost("status", run_id, timeout=60)
        assert "launching" not in status.stdout and "running" not in status.stdout, status.stdout
        assert "launch never completed: the controller was lost during the launch" \
            in status.stdout, status.stdout
        assert f"multihost rerun {run_id}" in status.stdout + status.stderr, status.stdout
        data = json.loads(lab.multihost("status", run_id, "--json", timeout=60).stdout)
        assert data["state"] == "stopped"
        assert [n["state"] for n in data["nodes"]] == ["stopped"] * 4
        # The hosts are free again: the next run starts at once.
        after = lab.multihost(*run_argv(lab, code, 4, "--detach"), "--", "sleeper.py", timeout=120)
        assert after.returncode == 0, after.stderr[-2000:]
        assert lab.multihost("stop", "--kill-wait", "1", timeout=60).returncode == 0
    finally:
        controller.kill()
        for i in range(1, 5):
            lab.host_run(i, ["rm", "-f", f"/root/{name}"])


def test_a_followed_run_outlives_its_launch_deadline(lab, code):
    """Every node of a followed run hears that all launched (its status stream carries
    the word), so a job that runs past --launch-timeout is not stopped by its own nodes."""
    (code / "outlives.py").write_text("import time\ntime.sleep(6)\nprint('done', flush=True)\n")
    done = lab.multihost(*run_argv(lab, code, 2, "--launch-timeout", "2"), "--", "outlives.py",
                         timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("done") == 2, done.stdout


# -- 12: the list is true, and a hang names the rank that stands apart -------------------
def test_status_list_says_when_a_runs_controller_is_gone(lab, code):
    controller = Controller(lab, run_argv(lab, code, 2) + ["--", "sleeper.py"])
    try:
        run_id = controller.run_id()
        wait_for(lambda: [n.get("state") for n in record_of(lab, run_id).get("nodes", [])]
                 == ["running"] * 2, 60, "the run never ran")
        listed = lab.multihost("status", "--list", timeout=60).stdout
        row = next(line for line in listed.splitlines() if line.startswith(run_id))
        assert " running " in row and "running?" not in row, listed     # followed: true
        controller.kill()
        listed = lab.multihost("status", "--list", timeout=60).stdout
        row = next(line for line in listed.splitlines() if line.startswith(run_id))
        assert " running? " in row, listed
        assert (f"{run_id}: running? controller gone" in listed
                and f"(fix: multihost status {run_id} asks the hosts)" in listed), listed
        data = json.loads(lab.multihost("status", "--list", "--json", timeout=60).stdout)
        assert [r["controller_gone"] for r in data if r["run_id"] == run_id] == [True]
    finally:
        controller.kill()
        lab.multihost("stop", "--kill-wait", "1", timeout=60)


# Every rank writes a few lines and falls silent at the same moment: rank 2 stuck in its
# own function, the others waiting for it in theirs. Only the stacks tell them apart.
STUCK = textwrap.dedent("""\
    import os, time
    rank = int(os.environ["RANK"])

    def stuck_in_collective():
        time.sleep(600)

    def wait_for_peers():
        time.sleep(600)

    for step in range(3):
        print("rank %d tick %d" % (rank, step), flush=True)
        time.sleep(0.3)
    stuck_in_collective() if rank == 2 else wait_for_peers()
""")


def test_a_hang_is_blamed_on_the_rank_whose_stack_stands_apart(lab, code):
    (code / "stuck.py").write_text(STUCK)
    controller = Controller(lab, run_argv(lab, code, 4, "--kill-wait", "1", "--hang-timeout", "5")
                            + ["--", "stuck.py"])
    try:
        run_id = controller.run_id()
        assert controller.wait(120) == 1, controller.text("err")[-3000:]
    finally:
        controller.kill()
    last = controller.text("err").strip().splitlines()[-1]
    assert "hung: no rank wrote a line for 5s" in last, last
    assert last.startswith("multihost: 198.18.0.13: ") and "node 2, rank 2" in last, last
    assert "rank 2's stack differs from every other rank's" in last, last
    cause = json.loads(lab.multihost("status", run_id, "--json", timeout=60).stdout)["root_cause"]
    assert (cause["host"], cause["node_rank"], cause["rank"]) == ("198.18.0.13", 2, 2), cause
    assert not found_on(lab, range(1, 5), run_id)


# -- 10: every file a user names is read within bounds ------------------------------------
def bounded_multihost(lab, *args: str):
    """`multihost ARGS` with its address space capped at 1 GiB (an unbounded read of
    /dev/zero took 22 GB and woke the OOM killer)."""
    return lab.run(["prlimit", "--as=1073741824", sys.executable, "-m", "multihost", *args],
                   timeout=60)


def test_files_a_user_names_are_read_within_bounds_named_in_the_error(lab, tmp_path, code):
    many = tmp_path / "many.ini"
    many.write_text("".join(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}\n" for i in range(5000)))
    long_line = tmp_path / "long.env"
    long_line.write_text("A=" + "x" * 200_000 + "\n")
    big_job = tmp_path / "job.toml"
    big_job.write_text("# filler\n" * 200_000 + 'command = ["sleeper.py"]\n')
    cases = [
        (["exec", "--hostfile", "/dev/zero", "--", "true"], "/dev/zero", "larger than 1 MiB"),
        (["exec", "--hostfile", str(many), "--", "true"], str(many), "more than 4096 hosts"),
        (["run", "--ips", ips(lab, 1), "--code", str(code), "--env-file", str(long_line),
          "--", "sleeper.py"], f"{long_line}:1", "longer than 65536 characters"),
        (["run", "-f", str(big_job), "--ips", ips(lab, 1)], str(big_job), "larger than 1 MiB"),
        (["run", "-f", "/dev/zero", "--ips", ips(lab, 1)], "/dev/zero", "larger than 1 MiB"),
    ]
    for argv, where, bound in cases:
        started = time.monotonic()
        result = bounded_multihost(lab, *argv)
        assert result.returncode == 2, (argv, result.stderr[-2000:])
        assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr, argv
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("multihost: ") and where in line and bound in line, (argv, line)
        assert "(fix: " in line, line
        assert time.monotonic() - started < 20, argv


# -- 11: `~` is the home directory everywhere; no job in a system directory ---------------
def test_log_dir_tilde_is_home_and_a_dash_is_refused(lab, tmp_path, code):
    (code / "hello.py").write_text("print('hello', flush=True)\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    name = f"logs-{secrets.token_hex(3)}"
    argv = ["run", "--ips", ips(lab, 1), "--python", sys.executable, "--launcher", "python",
            "--code", str(code), "--no-check", "--plain"]
    result = lab.run([sys.executable, "-m", "multihost", *argv, "--log_dir", f"~/{name}", "--",
                      "hello.py"], timeout=120, cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (cwd / "~").exists()                     # it made ./~/logs-...
    run_id = re.search(r"\d{8}-\d{6}-[0-9a-f]{4}", result.stderr).group(0)
    assert (lab.home / name / run_id).is_dir()
    refused = lab.run([sys.executable, "-m", "multihost", *argv, "--log_dir", "-", "--",
                       "hello.py"], timeout=120, cwd=cwd)
    assert refused.returncode == 2, refused.stderr[-2000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("multihost: --log_dir -") and "(fix: " in line, line
    assert list(cwd.iterdir()) == []                    # it made ./-


# The lab's hosts share this machine's file system but /root: a workdir outside /root is
# only ever tried with what cannot write (sync --dry-run, run --no-sync), so a multihost
# that accepts it (as it did) writes nothing into this machine's / or /etc.
@pytest.mark.parametrize("workdir", ["/", "/etc", "/usr/../etc/", "..", "~", "~/", "~/.ssh"])
def test_sync_and_run_refuse_a_system_or_home_workdir_before_writing(lab, code, workdir):
    (code / "authorized_keys").write_text("ssh-ed25519 AAAA not-yours\n")
    before = on_host(lab, 1, "/root/.ssh/authorized_keys").read_bytes()
    private = workdir.startswith("~")
    commands = [["sync", *([] if private else ["--dry-run"])],
                ["run", "--no-check", "--launcher", "python", *([] if private else ["--no-sync"])]]
    for command in commands:
        tail = [] if command[0] == "sync" else ["--", "sleeper.py"]
        result = lab.multihost(*command, "--ips", ips(lab, 1), "--code", str(code), "--workdir",
                               workdir, "--plain", *tail, timeout=120)
        assert result.returncode == 2, (command, result.stderr[-2000:])
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("multihost: ") and "workdir" in line, line
        assert "(fix: " in line and "--workdir" in line.split("(fix: ")[1], line
        assert "Traceback" not in result.stderr
    assert on_host(lab, 1, "/root/.ssh/authorized_keys").read_bytes() == before
    assert not on_host(lab, 1, "/root/authorized_keys").exists()
    assert not found_on(lab, [1], str(code))


# -- 9: a full run directory is named, not taken for a dead supervisor --------------------
FILLER = textwrap.dedent("""\
    import os, sys, time
    print("up", flush=True)
    time.sleep(1)
    if os.environ["RANK"] == "1":
        for i in range(4096):      # 4 MiB of lines into a 1 MiB ~/.multihost
            print("x" * 1023, flush=True)
    time.sleep(600)
""")


def test_a_full_run_directory_is_named_with_its_fix(lab, code):
    (code / "filler.py").write_text(FILLER)
    lab.host_run(2, ["mkdir", "-p", "/root/.multihost"], check=True)
    lab.host_run(2, ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/root/.multihost"],
                 check=True)
    try:
        result = lab.multihost(*run_argv(lab, code, 2, "--kill-wait", "1"), "--", "filler.py",
                               timeout=180)
        assert result.returncode not in (0, 2), result.stderr[-3000:]
        run_id = re.search(r"\d{8}-\d{6}-[0-9a-f]{4}", result.stderr).group(0)
        last = result.stderr.strip().splitlines()[-1]
        assert "no space left in ~/.multihost on 198.18.0.12" in last, last
        assert "supervisor died" not in result.stderr
        assert "(fix: " in last and "df -h ~/.multihost" in last, last
        shown = lab.multihost("status", run_id, "--plain", timeout=60).stdout
        assert "no space left in ~/.multihost" in shown and "supervisor died" not in shown, shown
        assert not found_on(lab, [1, 2], run_id)
    finally:
        lab.host_run(2, ["umount", "/root/.multihost"])


# -- 7: a command that gives up on a host ends what it started there ---------------------
def test_a_host_whose_python_hangs_is_blamed_alone_and_left_clean(lab, tmp_path, code):
    token = f"hangpy{secrets.token_hex(3)}"
    hang = on_host(lab, 2, f"/root/{token}")
    hang.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import time; time.sleep(3600)' {token}\n")
    hang.chmod(0o755)
    hostfile = tmp_path / "hosts.ini"
    hostfile.write_text("".join(f"[{lab.address(i)}]\npython = "
                                f"{f'/root/{token}' if i == 2 else sys.executable}\n" for i in (1, 2, 3)))

    def check_blames_host_2_alone():
        # Given up on at the check's deadline: its ssh connect, --timeout and a margin.
        checked = lab.multihost("check", "--hostfile", str(hostfile), "--code", str(code),
                                "--plain", "--connect-timeout", "3", "--timeout", "1",
                                timeout=300)
        text = checked.stdout + checked.stderr
        assert checked.returncode != 0
        assert f"FAIL {lab.address(2)}: " in text, text[-4000:]
        assert "198.18.0.[11" not in text and f"FAIL {lab.address(1)}" not in text, text[-4000:]
        wait_for(lambda: not found_on(lab, [2], token), 15, "the hung python was left on host 2")

    try:
        # The helper not there yet: its install is what hangs.
        lab.host_run(2, ["rm", "-rf", "/root/.cache/multihost"], check=True)
        check_blames_host_2_alone()
        # The helper there (a healthy check put it): its start is what hangs.
        healthy = lab.multihost("check", "--ips", lab.address(2), "--python", sys.executable,
                                "--code", str(code), "--plain", timeout=300)
        assert "helper" not in healthy.stdout + healthy.stderr
        check_blames_host_2_alone()
        # A python that has not started the helper in 8 s (MULTIHOST_HELPER_START, 60 s by
        # default) hangs.
        synced = lab.multihost("sync", "--hostfile", str(hostfile), "--code", str(code),
                               "--plain", timeout=300,
                               env=lab.env_with(MULTIHOST_HELPER_START="8"))
        assert synced.returncode != 0
        lines = [line for line in synced.stderr.splitlines() if line.startswith("multihost: ")]
        assert any(lab.address(2) in line and "did not start within 8s" in line
                   and "hangs while starting" in line for line in lines), synced.stderr[-3000:]
        assert not any(lab.address(1) in line or lab.address(3) in line for line in lines), \
            synced.stderr[-3000:]
        wait_for(lambda: not found_on(lab, [2], token), 15, "the hung python was left on host 2")
    finally:
        for pid_line in found_on(lab, [2], token).get(2, []):
            lab.host_run(2, ["kill", "-9", pid_line.split()[0]])
        hang.unlink()


# -- 8: success only for a command that ran; the cause named -----------------------------
def test_a_login_shell_that_exits_early_is_named_not_taken_for_success(lab, tmp_path, code):
    bashrc = on_host(lab, 2, "/root/.bashrc")
    before = bashrc.read_bytes() if bashrc.exists() else None
    bashrc.write_text("case $- in *i*) ;; *) exit 0;; esac\n" + (before or b"").decode())
    try:
        result = lab.multihost("exec", "--ips", ips(lab, 2), "--", "false", timeout=120)
        assert result.returncode != 0, result.stdout + result.stderr
        line = next(line for line in result.stderr.splitlines()
                    if line.startswith(f"multihost: {lab.address(2)}: "))
        assert "the login shell ended before the command ran" in line and "~/.bashrc" in line, line
        assert "(fix: " in line and "return" in line.split("(fix: ")[1], line
        checked = lab.multihost("check", "--ips", ips(lab, 2), "--python", sys.executable,
                                "--code", str(code), "--plain", timeout=300)
        text = checked.stdout + checked.stderr
        assert "the login shell ended before" in text and "~/.bashrc" in text, text[-3000:]
        assert "failed: exit status 0" not in text and "run `multihost check` on this host" not in text
    finally:
        if before is None:
            bashrc.unlink()
        else:
            bashrc.write_bytes(before)
    binary = on_host(lab, 2, "/root/binpy")
    binary.write_text("#!/bin/sh\nprintf '\\377\\376\\001\\002 not python'\nexit 0\n")
    binary.chmod(0o755)
    try:
        hostfile = tmp_path / "hosts.ini"
        hostfile.write_text(f"[{lab.address(1)}]\npython = {sys.executable}\n"
                            f"[{lab.address(2)}]\npython = /root/binpy\n")
        checked = lab.multihost("check", "--hostfile", str(hostfile), "--code", str(code),
                                "--plain", timeout=300)
        text = checked.stdout + checked.stderr
        assert checked.returncode != 0
        # Whether it answered a call or an install of the helper, it is named as such.
        assert re.search(r"/root/binpy (printed something that is not the multihost helper|"
                         r"did not unpack the multihost helper)", text), text[-3000:]
        assert "give a working python3 with --python" in text, text[-3000:]
        assert "failed: exit status 97" not in text and "run `multihost check` on this host" not in text
    finally:
        binary.unlink()
