"""The Python API stops what it starts, as the CLI does: a Ctrl-C inside ``run.lines()``,
the end of a ``with`` block and the script's plain exit leave nothing on any host;
``detach=True`` leaves the run running."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from test_run import SLEEPER, hostfile, leftovers, run_id_in, status_json, wait_running

START = textwrap.dedent("""\
    import sys, multihost
    cluster = multihost.Cluster.from_hostfile("hosts.ini")
    run = cluster.run(["sleeper.py"], launcher="python", nproc_per_node=2, kill_wait=2,
                      check=False, detach={detach})
    print("run", run.run_id, flush=True)
""")


@pytest.fixture
def job(lab, tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    hostfile(lab, tmp_path, 2).rename(tmp_path / "hosts.ini")
    return tmp_path


def script(job, body: str, detach: bool = False):
    path = job / "api_job.py"
    path.write_text(START.format(detach=detach) + textwrap.dedent(body))
    return path


def ended_everywhere(lab, run_id):
    assert leftovers(lab, 2, run_id) == {}
    assert {n["state"] for n in status_json(lab, run_id)["nodes"]} == {"stopped"}


def test_ctrl_c_inside_run_lines_stops_the_run_on_every_host(lab, job):
    path = script(job, """\
        for line in run.lines():
            print("line", line.text, flush=True)
    """)
    proc = lab.popen([sys.executable, str(path)], cwd=str(job), stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
    try:
        run_id = run_id_in(proc.stdout.readline())
        wait_running(lab, run_id, 2)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in err and proc.returncode != 0
    ended_everywhere(lab, run_id)
    assert took < 60, took   # the kill wait (2 s) and the teardown, not a hang


def test_the_scripts_plain_exit_stops_the_run_and_says_so(lab, job):
    path = script(job, """\
        next(iter(run.lines()))   # the job is up; the script ends without waiting
    """)
    done = lab.run([sys.executable, str(path)], cwd=str(job), timeout=120)
    assert done.returncode == 0, done.stderr
    run_id = run_id_in(done.stdout)
    assert f"stopping run {run_id} on every host" in done.stderr
    ended_everywhere(lab, run_id)


def test_leaving_a_with_block_stops_the_run_and_a_detached_run_goes_on(lab, job):
    path = script(job, """\
        with run:
            next(iter(run.lines()))
        print("states", sorted({n["state"] for n in run.status().to_json()["nodes"]}), flush=True)
        other = cluster.run(["sleeper.py"], launcher="python", nproc_per_node=1, sync=False,
                            check=False, detach=True, allow_concurrent=True)
        print("detached", other.run_id, flush=True)
    """)
    done = lab.run([sys.executable, str(path)], cwd=str(job), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "states ['stopped']" in done.stdout
    detached = done.stdout.split("detached ")[1].split()[0]
    try:
        assert "stopping run" not in done.stderr
        wait_running(lab, detached, 2)     # the script ended; the detached run did not
    finally:
        lab.multihost("stop", detached, "--kill-wait", "1", timeout=60)
    assert leftovers(lab, 2, detached) == {}
