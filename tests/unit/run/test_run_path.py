"""A job's processes run as in an activated environment: the directory of the job's
interpreter comes first on PATH, so a program that shells out to `python` gets it."""
import json
import os
import sys
from pathlib import Path

from multihost import helper
from multihost.run import launchers as launch
from multihost.hosts import Host
from multihost.job import JobOptions
from multihost.remote.run.files import python_first_on_path
from multihost.run.plan import Prepared, build_plan, launch_request
from multihost.run.records import new_run_id
from multihost.transport import LocalTransport

from test_launch_supervisor import wait_state

# What PaddleRec's data pipe does: start `python reader.py` by name.
JOB = "import subprocess; subprocess.run(['python', '-c', 'import sys; print(\"child\", sys.executable)'])\n"


def test_the_interpreters_directory_leads_path_once(tmp_path):
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    env = {"PATH": f"/usr/bin:{venv}:/bin"}
    python_first_on_path(env, f"{venv}/python")
    assert env["PATH"] == f"{venv}:/usr/bin:/bin"


def test_a_job_that_runs_python_by_name_gets_the_jobs_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")          # where `python` is another one, or none
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    host = Host("127.0.0.1", python=str(venv / "python"), workdir=str(work))
    transport = LocalTransport(host)
    run_id = new_run_id()
    plan = build_plan(run_id, [host], JobOptions(), launch.load_template("python"), ["job.py"],
                      start_port=17000, addresses=["127.0.0.1"])
    reply = helper.call(transport, "run.prepare", {"run_id": run_id, "node_rank": 0,
                                                   "cwd": str(work)})
    prepared = Prepared.from_reply(reply)
    request = launch_request(plan, plan.nodes[0], prepared)
    helper.call(transport, "run.launch", {"run_id": run_id}, input=json.dumps(request).encode())
    wait_state(transport, run_id, {"succeeded", "failed"})
    log = (Path(prepared.run_dir) / "log" / "workerlog.0").read_text()
    assert f"child {venv / 'python'}" in log, log
