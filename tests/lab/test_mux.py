"""Commands through a real OpenSSH master spoken to by the controller itself
(transport/mux_client.py): real sshd hosts, a master left by `start_master`, no `ssh`
client per command; a master killed half-way is exit 255 and the caller's other way."""
import hashlib
import json
import marshal
import os
import shutil
import signal
import sys
import textwrap

from test_sync import code, on_host, snapshot, sync, workdir  # noqa: F401 (fixtures)

SCRIPT = textwrap.dedent("""\
    import json, os, re, signal, subprocess, sys, time
    from multihost.hosts import Host
    from multihost.transport import SshOptions
    from multihost.transport import openssh

    host, options = Host(name=sys.argv[1]), SshOptions()
    openssh.start_master(host, options).wait(60)
    path = openssh.control_path(host, options)
    check = subprocess.run(["ssh", "-o", "ControlPath=" + path, "-O", "check", host.name],
                           capture_output=True, text=True)
    master = int(re.search(r"pid=([0-9]+)", check.stderr).group(1))

    started = []   # every process started from here on
    popen = subprocess.Popen.__init__
    def counted(self, args, *more, **kw):
        started.append(args)
        popen(self, args, *more, **kw)
    subprocess.Popen.__init__ = counted

    out = {}
    mux = openssh.MuxTransport.open(host, options)
    done = mux.run(["sh", "-c", "cat; echo oops >&2; exit 7"], input=b"names\\n", timeout=60)
    out["run"] = [done.stdout.decode(), done.stderr.decode(), done.exit_code]
    process = mux.start("read line; echo got $line; echo err >&2; exit 3")
    process.stdin.write(b"x\\n")
    process.stdin.close()
    out["start"] = [process.stdout.read().decode(), process.read_stderr().decode(),
                    process.wait(60)]
    process.close()
    out["processes"] = len(started)

    process = mux.start("echo started; sleep 120")
    out["first"] = process.stdout.readline().decode()
    os.kill(master, signal.SIGKILL)
    out["killed"] = [process.stdout.read().decode(), process.wait(60)]
    process.close()
    again = mux.run("echo through the master", timeout=60)   # none left: an ssh client
    out["again"] = [again.stdout.decode(), again.exit_code, len(started) - out["processes"]]
    print(json.dumps(out))
""")


def test_a_command_through_the_master_gets_its_streams_and_status_without_an_ssh_client(lab):
    done = lab.run([sys.executable, "-c", SCRIPT, lab.address(1)], timeout=240)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["run"] == ["names\n", "oops\n", 7]
    assert out["start"] == ["got x\n", "err\n", 3]
    assert out["processes"] == 0                 # no `ssh` client for either
    # the master killed while a command runs: what came is kept, the status is 255
    assert out["first"] == "started\n"
    assert out["killed"] == ["", 255]
    # and the next command, the master gone, is an `ssh` client that fails at once
    # (ProxyCommand=false: never a handshake of its own)
    assert out["again"] == ["", 255, 1]


def logged_ssh(lab, tmp_path):
    """The environment of a controller whose `ssh` writes its arguments to a log (one
    line per client started), and that log."""
    log = tmp_path / "ssh.log"
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.parent.mkdir()
    real = shutil.which("ssh")
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return {**lab.env, "PATH": f"{wrapper.parent}:{os.environ['PATH']}"}, log


def clients(log):
    """The `ssh` clients started for quick steps through a master."""
    text = log.read_text() if log.exists() else ""
    return [line for line in text.splitlines() if "ControlMaster=no" in line]


def test_a_quick_sync_starts_no_ssh_client_and_killed_masters_lose_nothing(lab, code, workdir,
                                                                            tmp_path):
    env, log = logged_ssh(lab, tmp_path)
    lab.stop_masters()
    assert sync(lab, code, workdir, env=env).returncode == 0
    pids = lab.wait_for_masters((1, 2, 3))          # this sync's
    quiet = sync(lab, code, workdir, env=env)     # through the masters: nothing to do
    assert quiet.returncode == 0 and quiet.stdout.count("up to date") == 3, quiet.stdout
    (code / "pkg3" / "mod3.py").write_text("VALUE = 'through the masters'\n")
    edited = sync(lab, code, workdir, env=env)
    assert edited.returncode == 0 and edited.stdout.count(") written") == 3, edited.stdout
    assert clients(log) == []                     # no `ssh` process for either
    for pid in pids:
        os.kill(pid, signal.SIGKILL)              # their sockets stay behind
    (code / "pkg3" / "mod3.py").write_text("VALUE = 'after the masters'\n")
    done = sync(lab, code, workdir, env=env)
    assert done.returncode == 0, done.stderr
    assert len(clients(log)) == 3                 # no session: the `ssh` client, then the full way
    for i in (1, 2, 3):
        assert f"{lab.address(i)}: 1 file (" in done.stdout
        assert snapshot(on_host(lab, i, workdir)) == snapshot(code), f"h{i}"
    again = sync(lab, code, workdir, env=env)
    assert again.returncode == 0 and again.stdout.count("up to date") == 3, again.stdout


def test_hosts_keep_the_recorded_names_and_a_lost_copy_costs_one_comparison(lab, code, workdir):
    """On real sshd hosts: after the first quick step each host keeps the recorded names
    in its own cache, and the controller's record says so (its next checks are sent
    none). A copy removed, or overwritten with other names, on one host: that host is
    compared by content, gets the edit like the others, and keeps the names again."""
    from multihost.sync.quick import names_file

    def copies(i):   # this workdir's (other tests' workdirs keep theirs)
        folder = on_host(lab, i, "/root/.cache/multihost/names")
        return sorted(folder.glob(names_file(workdir, "") + "*")) if folder.is_dir() else []

    assert sync(lab, code, workdir).returncode == 0
    (code / "pkg1" / "mod1.py").write_text("VALUE = 'kept names'\n")
    assert sync(lab, code, workdir).stdout.count(") written") == 3
    kept = [copies(i) for i in (1, 2, 3)]
    assert all(len(copy) == 1 for copy in kept)
    state = lab.home / ".cache" / "multihost" / "sync-state"

    def held():   # {host: the hash of the names its record says it keeps}
        records = [marshal.loads(p.read_bytes()) for p in state.glob("*.state")]
        return sorted(r.get("held", "") for r in records if r["root"].startswith(workdir))

    names = hashlib.sha256(held_copy := copies(1)[0].read_bytes()).hexdigest()
    assert held() == [names] * 3 and all(c[0].read_bytes() == held_copy for c in kept)
    for damage in ("removed", "other names"):
        if damage == "removed":
            kept[1][0].unlink()
        else:
            kept[1][0].write_bytes(b"pkg0\0pkg1")
        (code / "pkg1" / "mod1.py").write_text(f"VALUE = 'copy {damage}'\n")
        done = sync(lab, code, workdir)
        assert done.returncode == 0 and done.stdout.count(") written") == 3, done.stdout
        for i in (1, 2, 3):
            assert snapshot(on_host(lab, i, workdir)) == snapshot(code), f"h{i}"
        assert held() == ["", names, names]     # h2 was compared by content
        (code / "pkg1" / "mod1.py").write_text(f"VALUE = 'after the copy {damage}'\n")
        again = sync(lab, code, workdir)
        assert again.returncode == 0 and again.stdout.count(") written") == 3, again.stdout
        assert held() == [names] * 3 and kept[1][0].read_bytes() == held_copy
        assert snapshot(on_host(lab, 2, workdir)) == snapshot(code)
