"""A first sync to many hosts costs the controller's uplink about one copy of the tree:
what is the same for every host (the list of paths, the directories) travels once, with
the files, and nothing lost when the relay breaks. Six real sshd hosts; bytes are read
from the lab bridge's port in the controller's namespace (what the controller sent)."""
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multihost.lab.config import bridge_port, ctl_netns

HOSTS = (1, 2, 3, 4, 5, 6)


def on_host(lab, i, path):
    return lab.lab.paths.host_root(i) / Path(path).relative_to("/root")


def tree_of(root: Path) -> dict:
    """Every entry below root: a file's content and mode, a directory's mode."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            mode = oct(full.lstat().st_mode & 0o7777)
            out[str(full.relative_to(root))] = (full.read_bytes() if full.is_file() else "dir", mode)
    return out


def sent_by_controller(lab) -> int:
    shown = subprocess.run(["ip", "netns", "exec", ctl_netns(lab.name), "ip", "-s", "-j", "link",
                            "show", "dev", "br0"], capture_output=True, text=True, check=True)
    return int(json.loads(shown.stdout)[0]["stats64"]["tx"]["bytes"])


def sync(lab, code, workdir, *args, hosts=HOSTS):
    ips = ",".join(lab.address(i) for i in hosts)
    return lab.multihost("sync", "--ips", ips, "--code", str(code), "--workdir", workdir,
                         "--plain", *args)


def first_sync_sent(lab, code, hosts) -> int:
    """Bytes the controller sent for a first sync of ``code`` to ``hosts``."""
    workdir = f"/root/first-{secrets.token_hex(3)}"
    before = sent_by_controller(lab)
    done = sync(lab, code, workdir, hosts=hosts)
    sent = sent_by_controller(lab) - before
    assert done.returncode == 0, done.stderr
    want = tree_of(code)
    for i in hosts:
        assert tree_of(on_host(lab, i, workdir)) == want, f"h{i}"
    return sent


@pytest.fixture
def code(tmp_path):
    """1,500 small files in 30 directories (one read-only) and one heavy file: relayed."""
    root = tmp_path / "proj"
    for i in range(1500):
        path = root / f"pkg{i % 30}" / f"module_number_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE = {i}\n" * 60)
    (root / "weights.bin").write_bytes(os.urandom(20 << 20))
    os.chmod(root / "pkg7", 0o555)
    yield root
    os.chmod(root / "pkg7", 0o755)


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_each_host_more_costs_a_first_sync_little_besides_the_files(lab6, code):
    """Each host used to cost the uplink the manifest, the list of paths the sync owns,
    its directories and the names for the `stat` of its record: about 150 KB more a
    host for 1,500 files here. The files themselves travel once (host to host)."""
    warm = code.parent / "warm"
    warm.mkdir()
    (warm / "a.txt").write_text("x")
    assert sync(lab6, warm, f"/root/warm-{secrets.token_hex(3)}").returncode == 0  # the helper
    one = first_sync_sent(lab6, code, HOSTS[:1])
    six = first_sync_sent(lab6, code, HOSTS)
    per_host = (six - one) / (len(HOSTS) - 1)
    assert six < 1.1 * tree_bytes(code), f"{six / tree_bytes(code):.2f} copies"
    assert per_host < 30_000, f"{per_host / 1000:.1f} KB for each host more"


def test_a_first_sync_is_recorded_and_owned_on_every_host(lab6, code):
    workdir = f"/root/owned-{secrets.token_hex(3)}"
    assert sync(lab6, code, workdir).returncode == 0
    # What landed is recorded: the next sync finds every host as it left it ...
    again = sync(lab6, code, workdir)
    assert again.returncode == 0 and again.stdout.count("up to date") == len(HOSTS), again.stdout
    # ... and every host knows which paths are the sync's: a file removed here goes there.
    os.remove(code / "pkg3" / "module_number_3.py")
    removed = sync(lab6, code, workdir)
    assert removed.returncode == 0, removed.stderr
    for i in HOSTS:
        host = on_host(lab6, i, workdir)
        assert not (host / "pkg3" / "module_number_3.py").exists(), f"h{i}"
        assert tree_of(host) == tree_of(code), f"h{i}"


def node_of(lab, i, workdir):
    """The pid of host i's relay node (the helper that writes its files and passes the
    stream on; the host before it feeds it): its sync session, the helper that made its
    plan, once it is the node, its hop to the next host (an `ssh` child) started."""
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        procs[int(pid)] = (argv, comm, int(stat[stat.rindex(")") + 2:].split()[1]))
    for pid, (argv, _, _) in procs.items():
        if b"sync.session" not in argv:
            continue
        try:
            request = json.loads(argv[argv.index(b"sync.session") + 1])
        except (ValueError, IndexError):
            continue
        # node ranks follow the --ips order: host i is rank i - 1
        if request.get("root") == workdir and request.get("rank") == i - 1 and any(
                comm == "ssh" and parent == pid for _, comm, parent in procs.values()):
            return pid
    return None


def shaped_head(lab):
    """The controller's link to host 1 (the relay's head) slowed, so the relay can be
    cut while the heavy file is on its way."""
    dev, ns = bridge_port(1), ctl_netns(lab.name)
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                    "rate", "40mbit", "burst", "262144", "latency", "400ms"], check=True)
    return lambda: subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev,
                                   "root"], check=True)


def test_a_session_killed_mid_chain_still_leaves_every_host_complete(lab6, code):
    """Host 3's sync session, which is its relay node, is killed while the heavy file is
    on its way: hosts 3-6 then get everything from the controller (directories and the
    list of paths included), and every host is complete and recorded."""
    workdir = f"/root/cut-{secrets.token_hex(3)}"
    restore = shaped_head(lab6)
    try:
        proc = lab6.popen([sys.executable, "-m", "multihost", "sync", "--ips",
                           ",".join(lab6.address(i) for i in HOSTS), "--code", str(code),
                           "--workdir", workdir, "--plain"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        victim = on_host(lab6, 3, workdir)
        deadline = time.monotonic() + 60
        killed = False
        while not killed and time.monotonic() < deadline and proc.poll() is None:
            temps = list(victim.glob(".mh-tmp.*")) if victim.is_dir() else []
            pid = node_of(lab6, 3, workdir)
            if pid and any(t.stat().st_size > (2 << 20) for t in temps if t.exists()):
                os.kill(pid, signal.SIGKILL)
                killed = True
            time.sleep(0.01)
        out, err = proc.communicate(timeout=240)
    finally:
        restore()
    assert killed, "the relay never reached host 3 with the heavy file"
    assert proc.returncode == 0, err
    assert "sent from the controller instead" in out
    want = tree_of(code)
    for i in HOSTS:
        host = on_host(lab6, i, workdir)
        assert tree_of(host) == want, f"h{i}"
        assert not list(host.rglob(".mh-tmp.*")), f"h{i}"
    again = sync(lab6, code, workdir)
    assert again.returncode == 0 and again.stdout.count("up to date") == len(HOSTS), again.stdout
    os.remove(code / "pkg5" / "module_number_5.py")
    removed = sync(lab6, code, workdir)
    assert removed.returncode == 0, removed.stderr
    for i in HOSTS:
        assert not (on_host(lab6, i, workdir) / "pkg5" / "module_number_5.py").exists(), f"h{i}"
