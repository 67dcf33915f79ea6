"""`multihost sync` and data checks end to end: real sshd hosts, real keys, the CLI as the
controller runs it. Host files are read from the root namespace (each host's /root is a
directory of the lab), so assertions never depend on the code under test."""
import contextlib
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multihost.lab.config import bridge_port, ctl_netns



def on_host(lab, i, path):
    """Host i's file at absolute ``path`` (under /root), seen from outside the lab."""
    return lab.lab.paths.host_root(i) / Path(path).relative_to("/root")


def snapshot(root: Path):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            if full.is_symlink():
                out[rel] = "-> " + os.readlink(full)
            elif full.is_dir():
                out[rel] = "dir"
            else:
                st = full.stat()
                out[rel] = (hashlib.sha256(full.read_bytes()).hexdigest(), oct(st.st_mode & 0o777))
    return out


def sync(lab, code, workdir, *args, hosts=(1, 2, 3), **kw):
    ips = ",".join(lab.address(i) for i in hosts)
    return lab.multihost("sync", "--ips", ips, "--code", str(code), "--workdir", workdir,
                         "--plain", *args, **kw)


@pytest.fixture
def code(tmp_path):
    root = tmp_path / "proj"
    for i in range(60):
        path = root / f"pkg{i % 6}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE = {i}\n" * 20)
    (root / "train.py").write_text("import pkg0\nprint('training')\n")
    (root / "tools").mkdir()
    (root / "tools" / "launch.sh").write_text("#!/bin/sh\necho go\n")
    os.chmod(root / "tools" / "launch.sh", 0o755)
    os.symlink("pkg0/mod0.py", root / "alias.py")
    os.symlink("/mnt/datasets/coco", root / "dataset")
    return root


@pytest.fixture
def workdir():
    return f"/root/sync-{secrets.token_hex(3)}"


def test_fresh_sync_then_a_one_line_change_and_a_deletion_reach_every_host(lab, code, workdir):
    (code / "weights.bin").write_bytes(os.urandom(20 << 20))   # heavy: travels host to host
    done = sync(lab, code, workdir)
    assert done.returncode == 0, done.stderr
    want = snapshot(code)
    for i in (1, 2, 3):
        assert snapshot(on_host(lab, i, workdir)) == want, f"h{i}"
    assert "came host to host" in done.stdout
    # The relay is a chain: h1 received from the controller and connected to h2, h2 to h3.
    sshd_log = (lab.lab.paths.host_log(3) / "sshd.log").read_text()
    assert f"Accepted publickey for root from {lab.address(2)}" in sshd_log

    (code / "pkg3" / "mod3.py").write_text("VALUE = 'changed'\n" + "VALUE = 3\n" * 19)
    os.remove(code / "pkg1" / "mod7.py")
    done = sync(lab, code, workdir)
    assert done.returncode == 0, done.stderr
    for i in (1, 2, 3):
        host = on_host(lab, i, workdir)
        assert (host / "pkg3" / "mod3.py").read_text().startswith("VALUE = 'changed'")
        assert not (host / "pkg1" / "mod7.py").exists()
        assert snapshot(host) == snapshot(code)
    for i in (1, 2, 3):
        assert f"{lab.address(i)}: 1 file (208 B) written, 1 deleted" in done.stdout

    again = sync(lab, code, workdir)
    assert again.returncode == 0 and again.stdout.count("up to date") == 3


def test_the_next_sync_goes_through_the_connection_the_last_one_left(lab, code, workdir):
    """A sync leaves an OpenSSH master connection per host; the next sync's check and a
    small edit go through it, without a new SSH connection: they succeed while a host's
    sshd takes none, which no other way of connecting could."""
    lab.stop_masters()
    assert sync(lab, code, workdir).returncode == 0
    lab.wait_for_masters((1, 2, 3))                 # this sync's
    assert all((os.stat(p).st_mode & 0o777) == 0o600 for p in lab.control_sockets())
    assert (os.stat(lab.control_sockets()[0].parent).st_mode & 0o777) == 0o700
    (code / "pkg3" / "mod3.py").write_text("VALUE = 'edited'\n")
    with lab.sshd_stopped(2):
        refused = lab.ssh(2, "true")
        assert refused.returncode == 255          # no new connection gets in
        done = sync(lab, code, workdir)
        assert done.returncode == 0, done.stderr
        assert f"{lab.address(2)}: 1 file (17 B) written" in done.stdout
        again = sync(lab, code, workdir)
        assert again.returncode == 0 and again.stdout.count("up to date") == 3, again.stdout
        # the edit's record lets the next edit go the same way, through the master
        (code / "pkg3" / "mod3.py").write_text("VALUE = 'edited again'\n")
        done = sync(lab, code, workdir)
        assert done.returncode == 0, done.stderr
        assert f"{lab.address(2)}: 1 file (23 B) written" in done.stdout
    for i in (1, 2, 3):
        host = on_host(lab, i, workdir)
        assert snapshot(host) == snapshot(code), f"h{i}"
        assert not [p for p in host.rglob(".mh-tmp.*")]
    # and the record it left is right: a comparison by content finds nothing to do
    verified = sync(lab, code, workdir, "--verify")
    assert verified.returncode == 0 and verified.stdout.count("up to date") == 3


def test_verify_repairs_a_hand_edit_that_kept_size_and_mtime(lab, code, workdir):
    assert sync(lab, code, workdir).returncode == 0
    victim = on_host(lab, 2, workdir) / "pkg2" / "mod2.py"
    before = victim.stat()
    text = victim.read_text()
    victim.write_text(text.replace("VALUE = 2", "VALUE = 9", 1))   # same size
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert victim.stat().st_size == before.st_size
    done = sync(lab, code, workdir, "--verify")
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == text
    lines = done.stdout.splitlines()
    assert f"{lab.address(2)}: 1 file (" in "\n".join(lines)
    assert sum("up to date" in line for line in lines) == 2


def test_ignore_rules_and_reincludes(lab, code, workdir):
    (code / ".gitignore").write_text("*.ckpt\noutput/\n")
    (code / ".multihostignore").write_text("!pretrained.ckpt\nscratch/\n")
    (code / "pretrained.ckpt").write_text("weights to ship")
    (code / "epoch3.ckpt").write_text("stay home")
    for d in ("output", "scratch", ".git"):
        (code / d).mkdir()
        (code / d / "f").write_text("x")
    assert sync(lab, code, workdir, hosts=(1,)).returncode == 0
    host = on_host(lab, 1, workdir)
    assert (host / "pretrained.ckpt").exists() and (host / ".multihostignore").exists()
    for absent in ("epoch3.ckpt", "output", "scratch", ".git"):
        assert not (host / absent).exists(), absent


@contextlib.contextmanager
def slow_link(lab):
    """Host 1's link shaped to 40 Mbit/s from the controller, restored afterwards."""
    dev, ns = bridge_port(1), ctl_netns(lab.name)
    before = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev],
                            capture_output=True, text=True).stdout
    assert "tbf" not in before, "the session lab is not supposed to be shaped"
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                    "rate", "40mbit", "burst", "262144", "latency", "400ms"], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                       check=True)


def test_a_killed_sync_leaves_no_partial_file_and_the_next_one_finishes(lab, code, workdir):
    big = code / "model.bin"
    big.write_bytes(b"old!" * (4 << 20))                         # 16 MiB
    assert sync(lab, code, workdir, hosts=(1,)).returncode == 0
    host_dir = on_host(lab, 1, workdir)
    old = hashlib.sha256((host_dir / "model.bin").read_bytes()).hexdigest()
    big.write_bytes(os.urandom(16 << 20))
    (code / "pkg0" / "mod0.py").write_text("VALUE = 'new'\n")
    with slow_link(lab):
        interrupted_sync(lab, code, workdir, host_dir)
    assert not [p.name for p in host_dir.iterdir() if p.name.startswith(".mh-tmp.")]
    assert hashlib.sha256((host_dir / "model.bin").read_bytes()).hexdigest() == old
    done = sync(lab, code, workdir, hosts=(1,))
    assert done.returncode == 0, done.stderr
    assert snapshot(host_dir) == snapshot(code)


def interrupted_sync(lab, code, workdir, host_dir):
    """Start a sync to host 1, SIGKILL the controller once the big file is on its way,
    and wait until the host noticed."""
    proc = lab.popen([sys.executable, "-m", "multihost", "sync", "--ips", lab.address(1),
                      "--code", str(code), "--workdir", workdir, "--plain"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            temps = [p for p in host_dir.iterdir() if p.name.startswith(".mh-tmp.")]
            if temps and temps[0].stat().st_size > (2 << 20):
                break
            time.sleep(0.01)
        else:
            pytest.fail("the transfer never started")
        os.killpg(proc.pid, signal.SIGKILL)                      # the controller dies mid-file
    finally:
        proc.wait(10)
    deadline = time.monotonic() + 10
    while any(p.name.startswith(".mh-tmp.") for p in host_dir.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)


def make_dataset(lab, path, hosts=(1, 2, 3)):
    for i in hosts:
        root = on_host(lab, i, path)
        (root / "train").mkdir(parents=True)
        for n in range(40):
            (root / "train" / f"{n:03}.jpg").write_bytes(b"jpeg %d " % n * 100)
        (root / "labels.txt").write_text("cat\ndog\n")
    return [on_host(lab, i, path) for i in hosts]


def test_differing_data_is_named_blocks_run_and_sync_data_repairs_it_host_to_host(lab, tmp_path):
    path = f"/root/ds-{secrets.token_hex(3)}"
    copies = make_dataset(lab, path)
    ips = ",".join(lab.address(i) for i in (1, 2, 3))
    assert lab.multihost("sync", "--ips", ips, "--no-code", "--data", path).returncode == 0
    (copies[1] / "train" / "007.jpg").write_bytes(b"corrupted")
    os.remove(copies[1] / "train" / "009.jpg")
    (copies[1] / "stray.jpg").write_bytes(b"x")

    checked = lab.multihost("sync", "--ips", ips, "--no-code", "--data", path)
    assert checked.returncode == 4
    out = checked.stdout
    assert f"data {path}: differs on 1 of 3 hosts (compared with {lab.address(1)})" in out
    assert f"{lab.address(2)}: {path}: 1 missing (train/009.jpg), 1 extra (stray.jpg), " \
           f"1 differing (train/007.jpg)" in out
    assert f"multihost: {lab.address(2)}: data differs from the first host" in checked.stderr

    marker = f"/root/started-{secrets.token_hex(3)}"
    run = lab.multihost("run", "--ips", ips, "--no-sync", "--data", path, "--",
                        "touch", marker, timeout=120)
    assert run.returncode in (3, 4), run.stdout + run.stderr   # stopped by check or by sync
    assert "train/007.jpg" in run.stderr or "train/007.jpg" in run.stdout
    assert not any(on_host(lab, i, marker).exists() for i in (1, 2, 3))

    log = lab.lab.paths.host_log(2) / "sshd.log"
    seen = log.read_text().count(f"Accepted publickey for root from {lab.address(1)}")
    repaired = lab.multihost("sync", "--ips", ips, "--no-code", "--data", path, "--sync-data")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert snapshot(copies[1]) == snapshot(copies[0])
    # The files came from h1 itself, over its own ssh connection to h2.
    assert log.read_text().count(f"Accepted publickey for root from {lab.address(1)}") > seen
    assert "copied host to host" in repaired.stdout
    trash = list((copies[1].parent / f".{copies[1].name}.multihost-trash").rglob("*.jpg"))
    assert sorted(p.name for p in trash) == ["007.jpg", "stray.jpg"]      # nothing deleted


def test_a_relay_hop_that_cannot_ssh_falls_back_to_the_controller(lab, code, workdir):
    (code / "weights.bin").write_bytes(os.urandom(20 << 20))
    known = lab.lab.paths.host_root(1) / ".ssh" / "known_hosts"
    saved = known.read_bytes()
    known.write_text("")             # h1 no longer trusts h2's host key
    try:
        done = sync(lab, code, workdir)
    finally:
        known.write_bytes(saved)
    assert done.returncode == 0, done.stderr
    for i in (1, 2, 3):
        assert snapshot(on_host(lab, i, workdir)) == snapshot(code)
    assert f"host-to-host ssh to {lab.address(2)} failed" in done.stdout
    assert "sent from the controller instead" in done.stdout
