"""One writer per workdir on every host (docs/sync.md, "One writer at a time"): two shells
syncing different code into one workdir at once, a sync into a running job's workdir, a
sync killed half way, one machine under two names. What a user would see: every host's
tree is exactly one of the code trees, and every command says what it did."""
import os
import re
import secrets
import subprocess
import sys
import time

import pytest

from test_sync import interrupted_sync, on_host, slow_link, snapshot, sync

MARKER = ".multihost-incomplete"
SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(600)\n"


def tree(root, tag):
    """A code tree whose every file says which tree it is (the issue's layout: .py files
    and heavy pkg/b*.bin, 20 MB in all, that travel host to host)."""
    for i in range(30):
        path = root / f"mod{i % 3}" / f"m{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"TAG = {tag!r}\nN = {i}\n")
    (root / "pkg").mkdir()
    for i in range(10):
        (root / "pkg" / f"b{i}.bin").write_bytes(tag.encode() * (2 << 20))
    (root / "train.py").write_text(f"TAG = {tag!r}\n" + SLEEPER)
    return root


@pytest.fixture
def two_trees(tmp_path):
    return tree(tmp_path / "cA", "A"), tree(tmp_path / "cB", "B")


@pytest.fixture
def workdir():
    return f"/root/shared-{secrets.token_hex(3)}"


ALL = (1, 2, 3, 4)


def start_sync(lab, code, workdir):
    ips = ",".join(lab.address(i) for i in ALL)
    return lab.popen([sys.executable, "-m", "multihost", "sync", "--ips", ips, "--code", str(code),
                      "--workdir", workdir, "--plain"], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)


def debug(host):
    """The marker and the lock's record of a host's workdir, for a failure's message."""
    marker = host / MARKER
    lock = host.parent / (host.name + ".multihost-lock")
    return (marker.read_text() if marker.exists() else "", lock.read_text() if lock.exists() else "")


def mix(host, trees):
    return {path: [tag for tag, want in trees.items() if want.get(path) == value] or value
            for path, value in sorted(host.items())
            if any(want.get(path) != value for want in trees.values())}


def said(out, lab, i):
    """What a sync said of host i: its line and the notes under it."""
    lines = out.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(lab.address(i) + ": "):
            notes = []
            for more in lines[index + 1:]:
                if not more.startswith("    "):
                    break
                notes.append(more)
            return "\n".join([line] + notes)
    return ""


def test_two_writers_ten_rounds_each_leave_every_host_one_whole_tree_and_say_what_they_did(
        lab, two_trees, workdir):
    trees = {tag: snapshot(code) for tag, code in zip("AB", two_trees)}
    seen = {"waited": 0, "refused": 0, "A": 0, "B": 0}
    for round_ in range(10):
        procs = {tag: start_sync(lab, code, workdir) for tag, code in zip("AB", two_trees)}
        outs = {tag: proc.communicate(timeout=240) + (proc.returncode,)
                for tag, proc in procs.items()}
        for tag, (out, err, code) in outs.items():
            summary = out.splitlines()[-1] if out.strip() else ""
            assert (code == 0) == summary.startswith("4 of 4 hosts identical"), outs
        for i in ALL:
            host = on_host(lab, i, workdir)
            found = [tag for tag, want in trees.items() if snapshot(host) == want]
            assert found, f"round {round_}: h{i} holds a mix of A and B: " \
                f"{mix(snapshot(host), trees)}\n{outs}\n{debug(host)}"
            assert not (host / MARKER).exists()
            ok = {tag for tag, (out, _, _) in outs.items()
                  if said(out, lab, i) and "FAILED" not in said(out, lab, i)}
            for tag in set("AB") - ok:   # refused there: it names the one that held it
                assert "is being written by" in said(outs[tag][0], lab, i), outs[tag]
            # What a sync called identical is what the host holds, unless the other
            # wrote it after: the one that waited for the first.
            waited = {tag for tag in ok if "waited" in said(outs[tag][0], lab, i)}
            for tag in waited:      # it said so while it waited, not only at the end
                assert f"{lab.address(i)}: waiting for " in outs[tag][0], outs[tag][0]
            assert ok, f"round {round_}: neither sync reached h{i}: {outs}"
            seen["waited"] += len(waited)
            seen["refused"] += 2 - len(ok)
            seen[found[0]] += 1
            last = waited if len(ok) == 2 and len(waited) == 1 else ok
            if len(last) == 1:
                assert found == sorted(last), f"round {round_}: h{i}: {outs}"
    print(f"40 host-rounds: {seen['waited']} waits, {seen['refused']} refusals; "
          f"{seen['A']} ended with A, {seen['B']} with B")


def test_a_sync_into_the_workdir_of_a_running_run_is_refused_naming_the_run(lab, two_trees,
                                                                             workdir):
    code_a, code_b = two_trees
    ips = ",".join(lab.address(i) for i in (1, 2))
    started = lab.multihost("run", "--ips", ips, "--launcher", "python", "--code", str(code_a),
                            "--workdir", workdir, "--no-check", "--detach", "--", "train.py",
                            timeout=180)
    assert started.returncode == 0, started.stderr
    run_id = re.search(r"\b(\d{8}-\d{6}-[0-9a-f]{4})\b", started.stdout).group(1)
    try:
        same = sync(lab, code_a, workdir, "--verify", hosts=(1, 2))   # reads, writes nothing
        assert same.returncode == 0 and same.stdout.count("up to date") == 2, same.stdout
        done = sync(lab, code_b, workdir, hosts=(1, 2))
        assert done.returncode != 0
        assert f"in use by run {run_id}" in done.stderr + done.stdout
        assert f"multihost stop {run_id}" in done.stderr + done.stdout
        assert done.stdout.splitlines()[-1].startswith("0 of 2 hosts identical")
        for i in (1, 2):
            assert snapshot(on_host(lab, i, workdir)) == snapshot(code_a), f"h{i}"
    finally:
        lab.multihost("stop", run_id, "--kill-wait", "1", timeout=60)
    again = sync(lab, code_b, workdir, hosts=(1, 2))
    assert again.returncode == 0, again.stderr


def test_a_sync_killed_half_way_leaves_the_tree_marked_and_run_no_sync_refuses_it(
        lab, two_trees, workdir):
    code_a, code_b = two_trees
    assert sync(lab, code_a, workdir, hosts=(1,)).returncode == 0
    host_dir = on_host(lab, 1, workdir)
    big = code_b / "big.bin"
    big.write_bytes(os.urandom(16 << 20))
    with slow_link(lab):
        interrupted_sync(lab, code_b, workdir, host_dir)
    assert (host_dir / MARKER).exists()
    refused = lab.multihost("run", "--ips", lab.address(1), "--launcher", "python", "--no-sync",
                            "--no-check", "--workdir", workdir, "--code", str(code_b), "--",
                            "train.py", timeout=120)
    assert refused.returncode != 0
    text = refused.stderr + refused.stdout
    assert "incomplete: a sync into it did not finish" in text, text
    assert "multihost sync" in text
    assert "started" not in text
    done = sync(lab, code_b, workdir, hosts=(1,))
    assert done.returncode == 0, done.stderr
    assert not (host_dir / MARKER).exists()
    assert snapshot(host_dir) == snapshot(code_b)


@pytest.mark.parametrize("command", [["exec", "--", "hostname"], ["sync", "--plain"]])
def test_one_machine_under_two_names_is_refused(lab, two_trees, workdir, command):
    code_a, _ = two_trees
    extra = ["--code", str(code_a), "--workdir", workdir] if command[0] == "sync" else []
    done = lab.multihost(command[0], "--ips", f"{lab.address(1)},h1", *extra, *command[1:],
                         timeout=120)
    assert done.returncode != 0
    assert "h1 is the same machine as " + lab.address(1) in done.stderr, done.stderr
    assert "--exclude h1" in done.stderr or "list each machine once" in done.stderr
    assert not os.path.exists(on_host(lab, 1, workdir)) or command[0] != "sync"
