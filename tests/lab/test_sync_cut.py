"""A relay hop cut during a first sync (issue: the hosts behind it froze for 300 s, and
the progress claimed 39/40 files for the host that was cut at 4 s). What a user sees:
the cut noticed in about as long as a lost host takes in a run, the hosts behind the cut
fed from the controller, and progress lines that never claim more than a host has."""
import os
import re
import subprocess
import sys
import threading
import time

from test_sync import on_host, snapshot

HOSTS = (1, 2, 3, 4)
PROGRESS = re.compile(r"^(\S+): (\d+)/(\d+) files, ")


def held_by(lab, workdir):
    """The files of the tree host 2 holds in the workdir (whole: no temporary name, no
    mark, nothing of multihost's own, like the token a sharing probe leaves a moment)."""
    root = on_host(lab, 2, workdir)
    try:
        return sum(1 for path in root.rglob("*") if path.is_file() and not any(
            part.startswith(".") for part in path.relative_to(root).parts))
    except OSError:   # not there yet, or a file renamed while we looked
        return 0


def test_a_relay_hop_cut_mid_sync_is_noticed_fast_and_the_hosts_behind_it_fed_directly(
        lab, tmp_path):
    code = tmp_path / "proj"
    (code / "pkg").mkdir(parents=True)
    for i in range(36):
        (code / "pkg" / f"m{i}.py").write_text(f"N = {i}\n")
    for i in range(4):
        (code / f"w{i}.bin").write_bytes(os.urandom(6 << 20))   # 24 MB (over 16): host to host
    workdir = f"/root/cut-{os.urandom(3).hex()}"
    lines = []
    for i in HOSTS:
        lab.lab.shape(i, "40mbit")
    try:
        began = time.monotonic()
        proc = lab.popen([sys.executable, "-m", "multihost", "sync", "--ips",
                          ",".join(lab.address(i) for i in HOSTS), "--code", str(code),
                          "--workdir", workdir, "--plain"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         # a hop silent for this + 5 s is cut (15 + 5 by default)
                         env=lab.env_with(MULTIHOST_LOST_AFTER="6"))
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 30
        while held_by(lab, workdir) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)   # mid-stream: a heavy file there, the others on their way
        lab.lab.cut(2)
        cut_at = time.monotonic() - began
        try:
            proc.wait(timeout=200)
        finally:
            if proc.poll() is None:
                proc.kill()
            lab.lab.heal(2)
        took = time.monotonic() - began
        reader.join(10)
        err = proc.stderr.read()
    finally:
        for i in HOSTS:
            lab.lab.shape(i, None)
    out = "".join(lines)
    assert proc.returncode == 4, out + err
    assert took < 120, f"the sync took {took:.0f} s:\n{out}"
    assert f"{lab.address(2)}: FAILED" in out
    want = snapshot(code)
    for i in (1, 3, 4):
        assert snapshot(on_host(lab, i, workdir)) == want, f"h{i}"
    # What the progress said of the cut host is at most what it holds.
    held = held_by(lab, workdir)
    assert 1 <= held < 40, (held, out, err)
    claimed = [int(m.group(2)) for m in map(PROGRESS.match, lines)
               if m and m.group(1) == lab.address(2)]
    assert max(claimed, default=0) <= held, (claimed, held, out)
    print(f"cut at {cut_at:.1f} s; the sync ended after {took:.1f} s; h2 was shown {max(claimed, default=0)} "
          f"files and holds {held}")
