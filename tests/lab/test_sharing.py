"""Two controllers on one lab: the busy line names the holder, `status --all` sees every
run, a queued run starts by itself when the hosts free up, Ctrl-C and `stop` leave the
queue clean, and a torchrun started by hand is named."""
from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_run import hostfile, run_id_in

# Naps NAP seconds, or less: until the file GO names exists (the hosts share /var/tmp),
# made by the test once it has seen what it waits for.
SHORT = ("import os, time\n"
         "end, go = time.time() + float(os.environ.get('NAP', '8')), os.environ.get('GO')\n"
         "while time.time() < end and not (go and os.path.exists(go)):\n"
         "    time.sleep(0.1)\n"
         "print('done', flush=True)\n")


@pytest.fixture
def go():
    """A file whose making ends a nap (SHORT's GO), removed after the test."""
    path = Path("/var/tmp") / f"mh-go-{secrets.token_hex(4)}"
    yield path
    path.unlink(missing_ok=True)


def code_dir(tmp_path):
    directory = tmp_path / "code"
    directory.mkdir(exist_ok=True)
    (directory / "nap.py").write_text(SHORT)
    return directory


def start(lab, hosts, code, tmp_path, *extra, name="bert-large", nap="8"):
    return lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python", "--code",
                         str(code), "--name", name, "--detach", "--env", f"NAP={nap}",
                         "--log_dir", str(tmp_path / "log"), *extra, "--", "nap.py", timeout=120)


def queued(lab, hosts, code, tmp_path, name):
    argv = [sys.executable, "-m", "multihost", "run", "--hostfile", str(hosts), "--launcher",
            "python", "--code", str(code), "--name", name, "--queue", "--plain", "--env",
            "NAP=1", "--log_dir", str(tmp_path / "log"), "--", "nap.py"]
    return lab.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                     stdin=subprocess.DEVNULL)


def newest(runs):
    """{name: the newest run of that name}: the hosts keep ended runs a day, and several
    tests name their runs alike."""
    return {r["name"]: r for r in sorted(runs, key=lambda r: r["since"])}


def all_runs(lab, hosts, *extra):
    result = lab.multihost("status", "--all", "--hostfile", str(hosts), "--json", "--ended",
                           *extra, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["runs"]


def test_busy_names_the_holder_and_a_queued_run_starts_when_it_ends(lab, tmp_path, go):
    code = code_dir(tmp_path)
    hosts = hostfile(lab, tmp_path, 2)
    first = start(lab, hosts, code, tmp_path, "--env", f"GO={go}", nap="90")
    assert first.returncode == 0, first.stderr
    first_id = run_id_in(first.stdout)
    check = lab.multihost("check", "--hostfile", str(hosts), "--plain", timeout=120)
    said = check.stdout + check.stderr
    assert f'busy: root\'s run "bert-large" (run {first_id}, since' in said, said
    assert "add `--queue`" in said and "kill" not in said.split("busy:")[1].splitlines()[0]
    waiting = queued(lab, hosts, code, tmp_path, "second")
    try:
        deadline = time.monotonic() + 60
        while not any(r["state"] == "queued" for r in all_runs(lab, hosts)):
            assert time.monotonic() < deadline and waiting.poll() is None
            time.sleep(0.5)
        runs = newest(all_runs(lab, hosts))
        assert runs["bert-large"]["state"] in ("running", "starting")
        plain = lab.multihost("status", "--all", "--hostfile", str(hosts), timeout=60).stdout
        assert plain.splitlines()[0].split() == ["RUN", "NAME", "USER", "STATE", "HOSTS", "GPUS",
                                                 "SINCE", "EXIT", "TOOK"]
        assert [line.split()[:4] for line in plain.splitlines() if first_id in line] == \
            [[first_id, "bert-large", "root", "running"]]
        assert any("second" in line and "queued (1st)" in line for line in plain.splitlines())
        assert runs["second"]["state"] == "queued" and runs["second"]["place"] == 1
        # From this controller, by its name (it has no record yet) and as the newest run.
        for shown in (lab.multihost("status", "second", timeout=60),
                      lab.multihost("status", timeout=60)):
            assert shown.returncode == 0, shown.stderr
            assert shown.stdout.startswith("queued (run ") and '"second"): waiting in line for' \
                in shown.stdout and "multihost stop second" in shown.stdout, shown.stdout
        go.touch()   # the first run ends now
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, err
    assert 'queued: 1st, behind root\'s run "bert-large"' in err
    ended = newest(all_runs(lab, hosts))
    assert ended["bert-large"]["state"] == "succeeded" and ended["bert-large"]["exit_code"] == 0
    assert ended["second"]["state"] == "succeeded"
    # It started within seconds of the first one's end.
    gap = ended["second"]["started"] - ended["bert-large"]["ended"]
    assert gap < 15
    assert not [r for r in all_runs(lab, hosts, "--state", "queued")]


def test_ctrl_c_and_stop_leave_the_queue_clean(lab, tmp_path):
    code = code_dir(tmp_path)
    hosts = hostfile(lab, tmp_path, 2)
    first = start(lab, hosts, code, tmp_path, nap="60")
    first_id = run_id_in(first.stdout)
    try:
        a = queued(lab, hosts, code, tmp_path, "wait-a")
        b = queued(lab, hosts, code, tmp_path, "wait-b")
        deadline = time.monotonic() + 60
        while len(all_runs(lab, hosts, "--state", "queued")) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        a.send_signal(signal.SIGINT)
        a.communicate(timeout=60)
        assert lab.multihost("stop", "wait-b", timeout=60).returncode == 0
        b.communicate(timeout=60)
        assert all_runs(lab, hosts, "--state", "queued") == []
    finally:
        lab.multihost("stop", first_id, "--kill-wait", "1", timeout=60)


def test_a_hand_started_torchrun_is_named(lab, tmp_path):
    hosts = hostfile(lab, tmp_path, 2)
    made = lab.ssh(2, "mkdir -p /tmp/hand && echo 'import time; time.sleep(60)' > /tmp/hand/torchrun")
    assert made.returncode == 0, made.stderr
    # Started in a session that stays open: it descends from sshd, as a user's would.
    session = lab.popen(["ssh", "-o", "BatchMode=yes", lab.address(2), "python3 /tmp/hand/torchrun"],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid = None
    try:
        deadline = time.monotonic() + 30
        while pid is None:
            found = lab.ssh(2, "pgrep -xf 'python3 /tmp/hand/torchrun'")
            pid = int(found.stdout.split()[0]) if found.stdout.strip() else None
            assert time.monotonic() < deadline
            time.sleep(0.3)
        check = lab.multihost("check", "--hostfile", str(hosts), "--plain", timeout=120)
        said = check.stdout + check.stderr
        assert f"a training multihost did not start: root's pid {pid} (python3 /tmp/hand/torchrun)" \
            in said, said
    finally:
        if pid:
            lab.ssh(2, f"kill {pid}")
        session.kill()
        session.wait()


def test_ones_own_account_from_another_controller_is_waited_for_not_killed(lab, tmp_path, go):
    code = code_dir(tmp_path)
    hosts = hostfile(lab, tmp_path, 2)
    other = tmp_path / "ctl2"              # a second controller of the same account
    shutil.copytree(lab.home / ".ssh", other / ".ssh")

    def second(*args):
        return lab.run(["env", f"HOME={other}", sys.executable, "-m", "multihost", *args],
                       timeout=120)

    first = start(lab, hosts, code, tmp_path, "--env", f"GO={go}", nap="30")
    assert first.returncode == 0, first.stderr
    first_id = run_id_in(first.stdout)
    try:
        check = second("check", "--hostfile", str(hosts), "--plain")
        said = check.stdout + check.stderr
        assert check.returncode == 3 and f'busy: root\'s run "bert-large" (run {first_id}' in said
        fix = [line for line in said.splitlines() if "wait for it: add `--queue`" in line]
        assert fix and "if it is yours, stop it: `multihost stop bert-large` on root@" in fix[0]
        assert "kill" not in said, said
        # The fix, followed: the check waits its turn, then the hosts are ready.
        began = time.monotonic()
        waiting = lab.popen(["env", f"HOME={other}", sys.executable, "-m", "multihost", "check",
                             "--hostfile", str(hosts), "--plain", "--queue"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
        said_lines = []
        for line in waiting.stderr:   # as it waits, it says so; then the first run ends
            said_lines.append(line)
            if 'queued: 1st, behind root\'s run "bert-large"' in line:
                go.touch()
                break
        out, err = waiting.communicate(timeout=120)
        err = "".join(said_lines) + err
        assert waiting.returncode == 0, out + err
        assert 'queued: 1st, behind root\'s run "bert-large"' in err
        assert time.monotonic() - began < 40
        seen = newest(all_runs(lab, hosts))
        assert seen["bert-large"]["state"] == "succeeded"
    finally:
        lab.multihost("stop", first_id, "--kill-wait", "1", timeout=60)


def test_a_detached_queued_run_waits_in_the_background_and_runs(lab, tmp_path, go):
    code = code_dir(tmp_path)
    hosts = hostfile(lab, tmp_path, 2)
    first = start(lab, hosts, code, tmp_path, "--env", f"GO={go}", nap="90")
    first_id = run_id_in(first.stdout)
    try:
        began = time.monotonic()
        queued_bg = lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python",
                                  "--code", str(code), "--name", "later", "--queue", "--detach",
                                  "--env", "NAP=1", "--log_dir", str(tmp_path / "log"), "--",
                                  "nap.py", timeout=60)
        assert queued_bg.returncode == 0, queued_bg.stderr
        assert time.monotonic() - began < 20            # it did not wait in the foreground
        assert "waits for its hosts in the background" in queued_bg.stderr
        assert newest(all_runs(lab, hosts))["later"]["state"] == "queued"
        go.touch()   # the first run ends now
        deadline = time.monotonic() + 90
        while True:
            seen = newest(all_runs(lab, hosts))
            if seen.get("later", {}).get("state") == "succeeded":
                break
            assert time.monotonic() < deadline, seen
            time.sleep(1)
        assert seen["later"]["started"] >= seen["bert-large"]["ended"] - 1
        assert not all_runs(lab, hosts, "--state", "queued")
    finally:
        lab.multihost("stop", first_id, "--kill-wait", "1", timeout=60)


def test_the_team_view_lists_a_failed_run_as_failed_behind_ended_and_mine_picks_mine(lab, tmp_path):
    code = code_dir(tmp_path)
    (code / "fail.py").write_text("import os, sys, time\n"
                                  "sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(60)\n")
    hosts = hostfile(lab, tmp_path, 2)
    name = f"fails-{secrets.token_hex(2)}"
    done = lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python", "--code",
                         str(code), "--name", name, "--kill-wait", "1", "--no-check", "--plain",
                         "--log_dir", str(tmp_path / "log"), "--", "fail.py", timeout=120)
    assert done.returncode == 3, done.stderr
    # rank 1 failed on the second host, the teardown stopped the first: the run failed
    assert name not in newest(all_runs(lab, hosts, "--state", "running"))
    shown = lab.multihost("status", "--all", "--hostfile", str(hosts), "--json", timeout=60)
    assert name not in {r["name"] for r in json.loads(shown.stdout)["runs"]}   # ended: hidden
    ended = newest(all_runs(lab, hosts))          # all_runs asks with --ended
    assert ended[name]["state"] == "failed" and ended[name]["exit_code"] == 3
    table = lab.multihost("status", "--all", "--hostfile", str(hosts), "--ended", timeout=60).stdout
    rows = [line.split() for line in table.splitlines()[1:]]
    states = [row[3] for row in rows if row[3] in ("succeeded", "failed", "stopped")]
    assert states == sorted(states, key=("failed", "stopped", "succeeded").index), table
    mine = newest(all_runs(lab, hosts, "--mine"))
    assert name in mine and all(r["controller"].startswith("root@") for r in mine.values())
    nobody = lab.run([sys.executable, "-m", "multihost", "status", "--all", "--hostfile", str(hosts),
                      "--ended", "--mine", "--json"], timeout=60,
                     env=lab.env_with(USER="nobody", LOGNAME="nobody"))
    assert json.loads(nobody.stdout)["runs"] == [], nobody.stderr
    # no hosts named: those of the last run started here, said on stderr
    remembered = lab.multihost("status", "--all", "--ended", "--json", timeout=60)
    assert remembered.returncode == 0, remembered.stderr
    last = run_id_in(remembered.stderr)
    assert "the hosts of the last run" in remembered.stderr
    if last == run_id_in(done.stderr):      # no other test started one since
        assert name in {r["name"] for r in json.loads(remembered.stdout)["runs"]}
