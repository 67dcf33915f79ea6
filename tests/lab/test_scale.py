"""Sixty-four hosts, the top of our users' range, end to end in a lab of its own.

A healthy 64-host lab checks ready (no ping failure between healthy hosts); a short run
on all of them gives every rank's line once and succeeds; three links cut mid-run are all
named, every other host is stopped, and nothing is left anywhere once they heal.
"""
from __future__ import annotations

import contextlib
import re
import secrets
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

HOSTS = 64
CUT = (9, 33, 64)   # the hosts whose links the lost-host test cuts: first half, middle, last

HELLO = textwrap.dedent("""\
    import os, socket
    print("hello host=%s rank=%s of %s" % (socket.gethostname(), os.environ["RANK"],
                                           os.environ["WORLD_SIZE"]), flush=True)
""")

# Ranks that stay up until stopped; the token in argv finds them in a host's process table.
SLEEPER = textwrap.dedent("""\
    import os, time
    print("up rank=%s" % os.environ["RANK"], flush=True)
    time.sleep(600)
""")

SCAN = textwrap.dedent("""\
    import os, sys
    me = {os.getpid(), os.getppid()}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) not in me:
            try:
                argv = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\\0", b" ")
            except OSError:
                continue
            if sys.argv[1].encode() in argv:
                print(pid, argv.decode(errors="replace")[:120])
""")


@pytest.fixture
def code(tmp_path: Path) -> Path:
    directory = tmp_path / "code"
    directory.mkdir()
    (directory / "hello.py").write_text(HELLO)
    (directory / "sleeper.py").write_text(SLEEPER)
    return directory


def found_on(lab, hosts: Sequence[int], needle: str) -> Dict[int, List[str]]:
    """{host i: [process lines]} of every process whose argv holds ``needle``."""
    def scan(i: int) -> List[str]:
        result = lab.host_run(i, [sys.executable, "-c", SCAN, needle], check=True)
        return result.stdout.strip().splitlines()

    with ThreadPoolExecutor(8) as pool:
        return {i: lines for i, lines in zip(hosts, pool.map(scan, hosts)) if lines}


def test_a_healthy_64_host_lab_checks_ready(lab64):
    result = lab64.multihost("check", "--hostfile", str(lab64.hostfile), timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"^ready: 64 hosts", result.stdout, re.M), result.stdout[-2000:]
    assert "no echo" not in result.stdout


def test_a_short_run_on_64_hosts_gives_every_rank_once(lab64, code, tmp_path):
    result = lab64.multihost("run", "--hostfile", str(lab64.hostfile), "--launcher", "python",
                             "--nproc_per_node", "2", "--code", str(code), "--no-check",
                             "--plain", "--log_dir", str(tmp_path / "log"), "--", "hello.py",
                             timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = re.findall(r"^198\.18\.0\.(\d+) \[(\d+)\]: hello host=h(\d+) rank=(\d+) of 128$",
                       result.stdout, re.M)
    assert sorted(int(r[3]) for r in ranks) == list(range(128))
    # Ranks are in host order: host i (address .10+i) holds ranks 2(i-1) and 2(i-1)+1.
    assert all(int(a) - 10 == int(h) == int(r) // 2 + 1 for a, _, h, r in ranks)
    last = result.stderr.strip().splitlines()[-2:]   # the end, then where its logs are
    assert re.search(r"run \S+ succeeded", last[0]) and "log/latest/workerlog" in last[1]


def test_three_links_cut_mid_run_are_all_named_and_the_others_stopped(lab64, code, tmp_path):
    token = f"mhscale{secrets.token_hex(4)}"
    proc = lab64.popen([sys.executable, "-m", "multihost", "run", "--hostfile",
                        str(lab64.hostfile), "--launcher", "python", "--code", str(code),
                        "--no-check", "--kill-wait", "1", "--plain", "--log_dir",
                        str(tmp_path / "log"), "--", "sleeper.py", token],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=lab64.env_with(MULTIHOST_LOST_AFTER="8"))   # lost after 8 s
    run_id = None
    try:
        up = set()
        for line in proc.stdout:   # every rank says it is up before any link goes
            up.update(re.findall(r"up rank=(\d+)", line))
            if len(up) == HOSTS:
                break
        assert len(up) == HOSTS, proc.stderr.read()[-2000:]
        with contextlib.ExitStack() as cuts:
            for i in CUT:
                cuts.enter_context(lab64.cut_link(i))
            _, err = proc.communicate(timeout=180)
            assert proc.returncode == 255, err[-3000:]
            for i in CUT:   # each lost host is named, not only the first
                assert re.search(rf"198\.18\.0\.{10 + i} \(node {i - 1}\) lost", err), err[-3000:]
            last = err.strip().splitlines()[-1]
            assert "host lost" in last and any(f"198.18.0.{10 + i}" in last for i in CUT), last
            run_id = re.search(r"\b(\d{8}-\d{6}-[0-9a-f]{4})\b", err).group(1)
            others = [i for i in range(1, HOSTS + 1) if i not in CUT]
            left = found_on(lab64, others, token)
            assert left == {}, f"left running on hosts {sorted(left)}; " + err[-3000:]
        stopped = lab64.multihost("stop", run_id, "--kill-wait", "1", timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert found_on(lab64, range(1, HOSTS + 1), token) == {}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if run_id:
            lab64.multihost("stop", run_id, "--kill-wait", "0", timeout=120)
