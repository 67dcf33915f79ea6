"""Logs end to end: 3 hosts x 2 ranks printing numbered lines, through real runs."""
import json
import re
import signal
import subprocess
import sys
import time

import pytest

NUMBERS = """\
import os, sys, time
rank = os.environ["RANK"]
for i in range(int(sys.argv[1])):
    print("rank %s line %d" % (rank, i), flush=True)
    time.sleep(float(sys.argv[2]))
"""
LINE = re.compile(r"^(198\.18\.0\.\d+) \[(\d+)\]: rank (\d+) line (\d+)$")


@pytest.fixture
def job(tmp_path):
    code = tmp_path / "numbers"
    code.mkdir()
    (code / "numbers.py").write_text(NUMBERS)
    return code


def run_args(lab, code, *extra):
    return ["run", "--ips", ",".join(lab.addresses[:3]), "--python", sys.executable,
            "--launcher", "python", "--nproc_per_node", "2", "--code", str(code), "--no-check",
            "--plain", *extra]


def last_run(lab):
    return (lab.home / ".multihost" / "last").read_text().strip()


def numbered(text):
    """{rank: [line numbers]} of prefixed lines, checking each prefix names its host."""
    seen = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            host, rank, said, number = match.groups()
            assert rank == said and host == f"198.18.0.{11 + int(rank) // 2}", line
            seen.setdefault(int(rank), []).append(int(number))
    return seen


def mirrored(code, run_id):
    """{rank: [line numbers]} read from the controller's mirror files."""
    seen = {}
    for path in sorted((code / "log" / run_id).glob("*/log/workerlog.*")):
        node = int(path.parts[-3].rsplit(".", 1)[1]) - 11
        rank = node * 2 + int(path.name.rsplit(".", 1)[1])
        seen[rank] = [int(line.rsplit(" ", 1)[1]) for line in path.read_text().splitlines()]
    return seen


def test_every_line_exactly_once_with_its_rank_and_host(lab, job):
    done = lab.multihost(*run_args(lab, job, "--", "numbers.py", "40", "0.005"), cwd=job)
    assert done.returncode == 0, done.stderr
    everything = list(range(40))
    assert numbered(done.stdout) == {rank: everything for rank in range(6)}
    run_id = last_run(lab)
    # The run's last word says where its logs are, where a Paddle user looks for them.
    assert done.stderr.rstrip().splitlines()[-1] == \
        f"multihost: logs: log/latest/workerlog.N (this run: log/{run_id})"
    assert (job / "log" / "latest" / "workerlog.5").read_text().splitlines()[-1] == "rank 5 line 39"
    shown = lab.multihost("logs", run_id, cwd=job)
    assert shown.returncode == 0, shown.stderr
    assert numbered(shown.stdout) == {rank: everything for rank in range(6)}
    assert mirrored(job, run_id) == {rank: everything for rank in range(6)}
    filtered = lab.multihost("logs", run_id, "--rank", "3", "--tail", "5", cwd=job)
    assert numbered(filtered.stdout) == {3: list(range(35, 40))}
    grep = lab.multihost("logs", run_id, "--grep", "line 7$", "--host", lab.address(2), cwd=job)
    assert numbered(grep.stdout) == {2: [7], 3: [7]}
    as_json = lab.multihost("logs", run_id, "--json", "--rank", "0", cwd=job)
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [e["text"] for e in events if e["event"] == "line"] == [f"rank 0 line {i}" for i in range(40)]


def test_a_killed_controller_loses_and_repeats_nothing(lab, job):
    controller = lab.popen([sys.executable, "-m", "multihost",
                            *run_args(lab, job, "--", "numbers.py", "150", "0.02")],
                           cwd=job, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline and not list((job / "log").glob("*/*/log/workerlog.*")):
        time.sleep(0.2)
    time.sleep(0.5)
    controller.send_signal(signal.SIGKILL)  # mid-run: the job must go on without it
    controller.wait()
    run_id = last_run(lab)
    partial = mirrored(job, run_id)
    assert partial and all(len(v) < 150 for v in partial.values())
    again = lab.multihost("logs", run_id, "--follow", "--plain", cwd=job, timeout=120)
    assert again.returncode == 0, again.stderr
    everything = list(range(150))
    assert mirrored(job, run_id) == {rank: everything for rank in range(6)}
    assert numbered(again.stdout) == {rank: everything for rank in range(6)}
    # It ends as the run would have: the run's end, then where its logs are.
    assert f"multihost: run {run_id} succeeded\nmultihost: logs: " in again.stderr, again.stderr


def test_a_cut_host_keeps_its_lines_up_to_the_cut_and_shows_as_lost(lab, job):
    controller = lab.popen([sys.executable, "-m", "multihost",
                            *run_args(lab, job, "--kill-wait", "2", "--",
                                      "numbers.py", "600", "0.05")],
                           cwd=job, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=lab.env_with(MULTIHOST_LOST_AFTER="6"))   # lost after 6 s
    deadline = time.time() + 30
    while time.time() < deadline and not list((job / "log").glob("*/198.18.0.12/log/workerlog.*")):
        time.sleep(0.2)
    time.sleep(1.0)
    with lab.cut_link(2):
        out, err = controller.communicate(timeout=90)
        run_id = last_run(lab)
        kept = mirrored(job, run_id)
    assert controller.returncode != 0
    assert "198.18.0.12 (node 1) lost" in err
    for rank in (2, 3):  # what arrived before the cut is there, whole and in order
        assert kept[rank] and kept[rank] == list(range(len(kept[rank])))
    lab.multihost("stop", run_id, timeout=60)
