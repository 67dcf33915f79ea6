"""The Python API (docs/api.md) against the lab: every example of the page runs as
written, and the API's results and errors are the CLI's."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
DOC = REPO / "docs" / "api.md"


def examples():
    """The ```python blocks of docs/api.md, each with the heading it stands under."""
    text = DOC.read_text()
    found = []
    for match in re.finditer(r"```python\n(.*?)```", text, re.S):
        heading = re.findall(r"^## (.+)$", text[:match.start()], re.M)
        found.append(pytest.param(match.group(1), id=(heading[-1] if heading else "top")
                                  .lower().replace(" ", "-").strip("?,")))
    return found


@pytest.fixture
def job_dir(lab, tmp_path):
    """A directory as a user would have it: the hostfile and a training script."""
    shutil.copy(lab.hostfile, tmp_path / "hosts.ini")
    shutil.copy(REPO / "examples" / "train_ddp.py", tmp_path / "train.py")
    return tmp_path


def test_the_page_has_examples():
    assert len(examples()) >= 6


@pytest.mark.parametrize("code", examples())
def test_every_example_of_the_api_page_runs(lab, job_dir, code):
    done = lab.run([sys.executable, "-c", code], cwd=str(job_dir), timeout=240)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "Traceback" not in done.stderr


def test_an_attached_run_yields_states_lines_and_the_end_in_order(lab, job_dir):
    code = """
import multihost
cluster = multihost.Cluster.from_hostfile("hosts.ini")
run = cluster.run(["-c", "import os; print('hello from', os.environ['RANK'], flush=True)"],
                  launcher="python", nproc_per_node=2, sync=False)
kinds, lines = [], set()
for event in run.events():
    kinds.append(type(event).__name__)
    if isinstance(event, multihost.LogBlock):
        lines.update(event.lines)
print(kinds[0], kinds[-1], sorted(lines))
"""
    done = lab.run([sys.executable, "-c", code], cwd=str(job_dir), timeout=240)
    assert done.returncode == 0, done.stderr
    first, last, rest = done.stdout.split(" ", 2)
    assert (first, last) == ("RunStarted", "RunFinished")
    for rank in range(2 * lab.n):
        assert f"hello from {rank}" in rest


def test_a_failed_preflight_raises_the_clis_error_before_anything_starts(lab, job_dir):
    code = """
import multihost
cluster = multihost.Cluster.from_hostfile("hosts.ini", python="/nonexistent/python")
try:
    cluster.run(["train.py"])
except multihost.CheckError as err:
    print("refused:", err)
"""
    def recorded_runs():   # of this job: another test's runs may start meanwhile
        listed = json.loads(lab.multihost("status", "--list", "--json").stdout)
        return {r["run_id"] for r in listed if r["command"][-1:] == ["train.py"]}

    before = recorded_runs()
    done = lab.run([sys.executable, "-c", code], cwd=str(job_dir), timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: ") and "/nonexistent/python" in done.stdout
    assert "198.18.0.1" in done.stdout                       # the host is named
    assert recorded_runs() == before                         # nothing started or recorded


def test_a_spare_given_to_cluster_run_takes_the_rank_of_a_host_that_fails_the_preflight(
        lab, job_dir):
    (job_dir / "two.ini").write_text(
        f"[defaults]\nuser = root\n[{lab.address(1)}]\n"
        f"[{lab.address(2)}]\nport = 2\n")   # nothing listens there: the check fails
    code = f"""
import multihost
cluster = multihost.Cluster.from_hostfile("two.ini", python={sys.executable!r}, workdir="/opt")
run = cluster.run(["-c", "import os, socket; print('rank', os.environ['RANK'], 'on', "
                   "socket.gethostname(), flush=True)"], launcher="python", sync=False,
                  nproc_per_node=1, spares="{lab.address(3)}")
lines = sorted(line.text for line in run.lines())
print(run.wait().exit_code, [r["spare"] for r in run.record.replacements], lines)
"""
    done = lab.run([sys.executable, "-c", code], cwd=str(job_dir), timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"0 ['{lab.address(3)}'] "), done.stdout
    assert "rank 1 on" in done.stdout and "rank 0 on" in done.stdout


def test_cluster_rerun_runs_an_always_setup_again_and_keeps_the_spares(lab, job_dir):
    (job_dir / "two.ini").write_text(
        f"[defaults]\nuser = root\n[{lab.address(1)}]\n"
        f"[{lab.address(2)}]\nport = 2\n")   # nothing listens there: a spare takes node 1
    mark = f"setup-{job_dir.name}"            # this test's own, on every host
    code = f"""
import os, multihost
cluster = multihost.Cluster.from_hostfile("two.ini", python={sys.executable!r}, workdir="/opt")
first = cluster.run(["-c", "import sys; print('args', *sys.argv[1:], flush=True)", "--epochs", "1"],
                    launcher="python", sync=False, nproc_per_node=1, setup_always=True,
                    setup="echo ran-$(hostname) >> ~/{mark}",
                    spares="{lab.address(3)},{lab.address(4)}")
print("first", first.wait().exit_code, [r["spare"] for r in first.record.replacements])
os.chdir("/")
again = multihost.Cluster.rerun(first.run_id, ["--resume", "ckpt"])
said = sorted(line.text for line in again.lines())
print("again", again.wait().exit_code, [s["name"] for s in again.record.spares], said)
"""
    try:
        done = lab.run([sys.executable, "-c", code], cwd=str(job_dir), timeout=240)
        assert done.returncode == 0, done.stderr
        assert f"first 0 ['{lab.address(3)}']" in done.stdout, done.stdout
        # The spare that took node 1 runs it again; the one left stands by again.
        assert f"again 0 ['{lab.address(4)}'] ['args --resume ckpt', 'args --resume ckpt']" \
            in done.stdout, done.stdout
        for host in (1, 3):   # the setup ran on each host of both runs, not "unchanged"
            seen = lab.ssh(host, f"cat ~/{mark}; hostname")
            lines = seen.stdout.split()
            assert lines.count(f"ran-{lines[-1]}") == 2, seen.stdout
        assert "setup unchanged" not in done.stderr
    finally:
        for host in (1, 3):
            lab.ssh(host, f"rm -f ~/{mark}")
