"""Two unix users, two controllers, one lab: bob meets root's run as busy with root named
and a fix that never stops it, `status --all` shows both users' runs from either side,
bob's queued run starts when root's ends, and three runs with overlapping host sets all
finish in the order they asked."""
from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from test_run import REPO, hostfile, run_id_in
from test_sharing import SHORT as NAP, go  # noqa: F401 (a fixture)


class User:
    """A second unix user on the lab: a passwd entry (the hosts share this machine's),
    a home in /run, which every lab host has of its own (its ~/.multihost per host), and
    a key of its own authorized on every host."""

    def __init__(self, lab, tmp_path: Path):
        self.lab, self.name = lab, "mhb" + secrets.token_hex(3)
        self.home = Path("/run") / self.name
        subprocess.run(["useradd", "-M", "-d", str(self.home), "-s", "/bin/sh", "-p", "*",
                        self.name], check=True)
        self.uid = pwd.getpwnam(self.name).pw_uid
        ssh = self.home / ".ssh"
        ssh.mkdir(parents=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "id_ed25519")],
                       check=True)
        shutil.copy(lab.home / ".ssh" / "known_hosts", ssh / "known_hosts")
        (ssh / "config").write_text(
            f"Host *\n    User {self.name}\n    IdentityFile {ssh / 'id_ed25519'}\n"
            f"    IdentitiesOnly yes\n    UserKnownHostsFile {ssh / 'known_hosts'}\n"
            "    StrictHostKeyChecking yes\n    BatchMode yes\n")
        key = (ssh / "id_ed25519.pub").read_text()
        for i in range(1, lab.n + 1):
            lab.host_run(i, ["sh", "-c", f"mkdir -p {ssh} && cat > {ssh}/authorized_keys && "
                                         f"chown -R {self.name}: {self.home} && chmod 700 {self.home} {ssh}"],
                         input=key, check=True)
        self.code = self.home / "code"
        self.code.mkdir()
        (self.code / "nap.py").write_text(NAP)
        lines = ["[defaults]", f"user = {self.name}", "python = /usr/bin/python3", "workdir = work"]
        lines += [f"[{lab.address(i)}]" for i in range(1, lab.n + 1)]
        self.hosts = self.home / "hosts.ini"
        self.hosts.write_text("\n".join(lines) + "\n")
        subprocess.run(["chown", "-R", f"{self.name}:", str(self.home)], check=True)

    def argv(self, *args: str):
        # This interpreter may live where another user can not read (a pyenv under /root):
        # the system's python3 of the same version runs this checkout with its packages.
        python = sys.executable if os.access(sys.executable, os.X_OK) and \
            not str(Path(sys.executable).resolve()).startswith("/root") else "/usr/bin/python3"
        start = ("import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); "
                 "sys.argv[0] = 'multihost'; runpy.run_module('multihost', run_name='__main__')")
        return ["runuser", "-u", self.name, "--", "env", f"HOME={self.home}", python, "-c",
                start, sysconfig.get_paths()["purelib"], *args]

    def multihost(self, *args: str, timeout: float = 120):
        return self.lab.run(self.argv(*args), timeout=timeout, cwd=str(self.home))

    def popen(self, *args: str):
        return self.lab.popen(self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, stdin=subprocess.DEVNULL, cwd=str(self.home))

    def remove(self):
        # Its ssh masters (ControlPersist) outlive its commands: stopped by pid, then gone.
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == self.uid:
                    os.kill(int(pid), 9)
            except OSError:
                pass
        time.sleep(0.5)
        subprocess.run(["userdel", self.name], check=True)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def bob(lab, tmp_path):
    user = User(lab, tmp_path)
    try:
        yield user
    finally:
        user.remove()


def root_code(tmp_path):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "nap.py").write_text(NAP)
    return code


def root_run(lab, hosts, code, tmp_path, name, nap, *extra):
    return lab.multihost("run", "--hostfile", str(hosts), "--launcher", "python", "--code",
                         str(code), "--name", name, "--env", f"NAP={nap}", "--log_dir",
                         str(tmp_path / "log"), *extra, "--", "nap.py", timeout=180)


def everyone(run, hosts, *extra):
    result = run("status", "--all", "--hostfile", str(hosts), "--ended", *extra, "--json",
                 timeout=60)
    assert result.returncode == 0, result.stderr
    # The newest run of each name: the hosts keep ended runs a day, and tests name alike.
    return {r["name"]: r for r in sorted(json.loads(result.stdout)["runs"], key=lambda r: r["since"])}


def test_another_users_run_is_busy_named_and_never_stopped_by_the_fix(lab, tmp_path, bob, go):
    hosts = hostfile(lab, tmp_path, 2)
    code = root_code(tmp_path)
    first = root_run(lab, hosts, code, tmp_path, "bert-large", "90", "--detach", "--env",
                     f"GO={go}")
    assert first.returncode == 0, first.stderr
    first_id = run_id_in(first.stdout)
    try:
        check = bob.multihost("check", "--ips", f"{lab.address(1)},{lab.address(2)}",
                              "--user", bob.name, "--python", "/usr/bin/python3", "--plain")
        said = check.stdout + check.stderr
        assert f'busy: root\'s run "bert-large" (run {first_id}, since' in said, said
        fix = [line for line in said.splitlines() if "add `--queue`" in line]
        assert fix and "--exclude" in fix[0] and "ask root" in fix[0], said
        assert "kill" not in said and "multihost stop" not in said, said
        # bob's own run, refused at its prepare the same way when it skips the check
        refused = bob.multihost("run", "--hostfile", str(bob.hosts), "--include",
                                f"{lab.address(1)}", "--launcher", "python", "--code",
                                str(bob.code), "--no-check", "--plain", "--", "nap.py")
        assert refused.returncode != 0 and "busy: root's run \"bert-large\"" in refused.stderr
        # status --all from bob's side and from root's: both see root's run
        mine = ("--include", f"{lab.address(1)},{lab.address(2)}")
        assert everyone(bob.multihost, bob.hosts, *mine)["bert-large"]["user"] == "root"
        # root's run by its name from bob's controller: a pointer that shows it
        logs = bob.multihost("logs", "bert-large")
        assert logs.returncode != 0 and "status --all --ended --json" in logs.stderr, logs.stderr
        assert everyone(bob.multihost, bob.hosts, *mine)["bert-large"]["controller"].startswith(
            "root@")
        waiting = bob.popen("run", "--hostfile", str(bob.hosts), "--include",
                            f"{lab.address(1)},{lab.address(2)}", "--launcher", "python",
                            "--code", str(bob.code), "--name", "bobs", "--queue", "--plain",
                            "--env", "NAP=1", "--", "nap.py")
        deadline = time.monotonic() + 60
        while "bobs" not in everyone(lab.multihost, hosts):
            assert time.monotonic() < deadline and waiting.poll() is None
            time.sleep(0.5)
        seen = everyone(lab.multihost, hosts)
        assert seen["bobs"]["user"] == bob.name and seen["bobs"]["state"] == "queued"
        go.touch()   # root's run ends now
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, err
        assert 'queued: 1st, behind root\'s run "bert-large"' in err
        done = everyone(bob.multihost, bob.hosts, *mine)
        assert done["bobs"]["state"] == "succeeded" and done["bert-large"]["state"] == "succeeded"
        assert done["bobs"]["started"] - done["bert-large"]["ended"] < 15, err
    finally:
        lab.multihost("stop", first_id, "--kill-wait", "1", timeout=60)


def test_three_runs_with_overlapping_host_sets_all_finish(lab, tmp_path, bob, go):
    code = root_code(tmp_path)
    a = ",".join(lab.address(i) for i in (1, 2))
    b = ",".join(lab.address(i) for i in (2, 3))
    c = ",".join(lab.address(i) for i in (1, 3))
    first = root_run(lab, hostfile(lab, tmp_path, 3), code, tmp_path, "wide", "90", "--detach",
                     "--env", f"GO={go}")
    assert first.returncode == 0, first.stderr
    runs = []
    for name, ips, who in (("ab", a, "root"), ("bc", b, "bob"), ("ca", c, "root")):
        if who == "bob":
            runs.append(bob.popen("run", "--hostfile", str(bob.hosts), "--include", ips,
                                  "--launcher", "python", "--code", str(bob.code), "--name",
                                  name, "--queue", "--plain", "--env", "NAP=2", "--", "nap.py"))
        else:
            runs.append(lab.popen([sys.executable, "-m", "multihost", "run", "--hostfile",
                                   str(lab.hostfile), "--include", ips, "--launcher", "python",
                                   "--code", str(code), "--name", name, "--queue", "--plain",
                                   "--env", "NAP=2", "--log_dir", str(tmp_path / "log"), "--",
                                   "nap.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, stdin=subprocess.DEVNULL))
        time.sleep(1.0)  # they ask in this order
    deadline = time.monotonic() + 60
    while True:
        seen = everyone(lab.multihost, hostfile(lab, tmp_path, 3))
        if all(seen.get(n, {}).get("state") == "queued" for n in ("ab", "bc", "ca")):
            break
        assert time.monotonic() < deadline and all(p.poll() is None for p in runs), seen
        time.sleep(0.5)
    go.touch()   # the wide run ends now: the three take their turns
    for proc in runs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    seen = everyone(lab.multihost, hostfile(lab, tmp_path, 3))
    assert all(seen[n]["state"] == "succeeded" for n in ("wide", "ab", "bc", "ca")), seen
    # ab and bc share host 2: bc (asked later) started after ab ended
    assert seen["bc"]["started"] >= seen["ab"]["ended"] - 1
    assert seen["ca"]["started"] >= seen["bc"]["ended"] - 1
