"""Real Slurm ending a run's job under it, Slurm's view in `status --all`, and check's
row for a node reached by srun (`multihost lab up 2 --slurm`, as test_slurm.py)."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from test_run import leftovers, run_id_in
from test_slurm import in_allocation, shared_dir, sleeper_code, slurm_lab  # noqa: F401 (fixtures)


def sleepers_up(lab, proc, count: int = 2, within: float = 120) -> None:
    """Wait until each node runs ``count`` sleeper ranks."""
    deadline = time.monotonic() + within
    while True:
        found = [lab.host_run(i, ["pgrep", "-f", "sleeper.py"]).stdout.split() for i in (1, 2)]
        if all(len(pids) >= count for pids in found):
            return
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.5)


def job_ids(lab, state: str) -> list:
    out = lab.run(["squeue", "-h", "-t", state, "-o", "%i"], check=True).stdout
    return out.split()


def no_leftovers(lab, run_id: str, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while leftovers(lab, 2, run_id):
        assert time.monotonic() < deadline, leftovers(lab, 2, run_id)
        time.sleep(0.5)


def test_scancel_from_outside_ends_the_run_at_once_in_one_line(slurm_lab, tmp_path):
    code = sleeper_code(tmp_path)
    proc = slurm_lab.popen(["salloc", "-N", "2", "sh", "-c",
                            f"multihost run --launcher python --nproc_per_node 2 --code {code} "
                            f"--no-check --plain --log_dir {tmp_path / 'log'} -- sleeper.py; "
                            "echo rc=$?"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        sleepers_up(slurm_lab, proc)
        job = job_ids(slurm_lab, "RUNNING")[0]
        cancelled = time.monotonic()
        slurm_lab.run(["scancel", job], check=True)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - cancelled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run_id = run_id_in(err)
    assert took < 8, (took, err[-3000:])       # not the 15 s a lost host is waited for
    assert "rc=143" in out, out + err[-3000:]
    said = [l for l in err.splitlines() if l.startswith(f"multihost: run {run_id} ended")]
    assert said == [f"multihost: run {run_id} ended: Slurm job {job} was cancelled (CANCELLED by "
                    "scancel) and Slurm ended every rank (fix: salloc -N 2 multihost rerun "
                    f"{run_id})"], err[-3000:]
    assert "lost" not in err and "multihost stop" not in err, err[-3000:]
    assert "failed" not in err, err[-3000:]     # stopped by Slurm, said once
    shown = slurm_lab.multihost("status", run_id, "--plain", timeout=60).stdout
    assert shown.startswith(f"run {run_id}: stopped (exit 143)"), shown
    assert f"Slurm job {job} was cancelled (CANCELLED by scancel)" in shown, shown
    no_leftovers(slurm_lab, run_id)


def test_check_inside_salloc_says_each_node_ran_an_srun_step(slurm_lab):
    r = in_allocation(slurm_lab, "multihost check --json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(r.stdout)
    text = json.dumps(report)
    rows = re.findall(r'"srun step in (\d+) ms"', text)
    assert len(rows) == 2, text[:3000]
    assert "password-free login" not in text


def test_status_all_shows_slurms_jobs_beside_the_runs(slurm_lab, tmp_path):
    code = sleeper_code(tmp_path)
    name = f"holder-{tmp_path.name[-6:]}"   # this test's run, whatever ran before it
    holder = slurm_lab.popen(["salloc", "-N", "2", "-J", "holder", "multihost", "run",
                              "--name", name,
                              "--launcher", "python", "--nproc_per_node", "1", "--code", str(code),
                              "--no-check", "--plain", "--log_dir", str(tmp_path / "log"), "--",
                              "sleeper.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    queued = None
    try:
        sleepers_up(slurm_lab, holder, count=1)
        queued = slurm_lab.popen(["salloc", "-N", "2", "-J", "waiter", "sleep", "1"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        deadline = time.monotonic() + 30
        while not job_ids(slurm_lab, "PENDING"):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        held, waiting = job_ids(slurm_lab, "RUNNING")[0], job_ids(slurm_lab, "PENDING")[0]
        r = slurm_lab.multihost("status", "--all", "--hostfile", str(slurm_lab.hostfile), timeout=90)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert any(re.search(r"\brunning\b", l) and "root" in l and name in l for l in lines), r.stdout
        assert "Slurm jobs (squeue, every user): 2" in lines, r.stdout
        assert any(l.split()[:3] == [held, "root", "RUNNING"] and "h[1-2]" in l and
                   l.split()[-1] == "holder" for l in lines), r.stdout
        assert any(l.split()[:3] == [waiting, "root", "PENDING"] and
                   re.search(r"\((Resources|Priority)\)", l) for l in lines), r.stdout
        data = json.loads(slurm_lab.multihost("status", "--all", "--hostfile",
                                              str(slurm_lab.hostfile), "--json", timeout=90).stdout)
        assert {(j["job_id"], j["state"]) for j in data["slurm"]} == {(held, "RUNNING"),
                                                                     (waiting, "PENDING")}
        assert [r["state"] for r in data["runs"] if r["name"] == name] == ["running"]
        # runs that ended before (earlier tests') wait behind --ended
        assert not [r for r in data["runs"] if r["state"] in ("succeeded", "failed", "stopped")]
    finally:
        slurm_lab.run(["scancel", "-u", "root"])
        for proc in (holder, queued):
            if proc is not None:
                try:
                    proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    deadline = time.monotonic() + 30    # COMPLETING for up to KillWait
    while slurm_lab.run(["squeue", "-h"], check=True).stdout.strip():
        assert time.monotonic() < deadline, slurm_lab.run(["squeue"]).stdout
        time.sleep(0.5)


def test_status_all_inside_an_allocation_takes_its_nodes(slurm_lab):
    r = in_allocation(slurm_lab, "multihost status --all")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Slurm jobs (squeue, every user): 1" in r.stdout, r.stdout
    assert re.search(r"(?m)^\d+\s+root\s+RUNNING\s+\S+\s+2\s+h\[1-2\]", r.stdout), r.stdout


EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


def test_the_fix_after_a_slurm_end_works_when_typed_and_ssh_says_the_job_ended(slurm_lab, tmp_path):
    # The fix an ended job gives (`salloc -N 2 multihost rerun RUN`) runs the same job on
    # the new allocation's nodes; outside one, rerun says what to type; and `ssh` to a
    # node of the ended job says the job ended, with the ssh that still reaches it.
    first = in_allocation(slurm_lab, f"multihost run --nproc_per_node 2 --code {EXAMPLES} "
                                     f"--plain --log_dir {tmp_path / 'log'} -- ranks.py", timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = run_id_in(first.stderr)
    outside = slurm_lab.multihost("rerun", run_id, "--plain", timeout=60)
    assert outside.returncode != 0
    assert outside.stderr.strip().splitlines()[-1].endswith(
        f"(fix: salloc -N 2 multihost rerun {run_id})"), outside.stderr
    typed = slurm_lab.run(["salloc", "-N", "2", "multihost", "rerun", run_id, "--plain"], timeout=240)
    assert typed.returncode == 0, typed.stderr[-3000:]
    assert (typed.stdout + typed.stderr).count("all_reduce sum=10 expected=10 ok") == 4
    shell = slurm_lab.multihost("ssh", "h2", "--run", run_id, timeout=60)
    assert shell.returncode != 0
    said = shell.stderr.strip().splitlines()[-1]
    assert said.startswith("multihost: h2: Slurm job ") and "srun reaches none of its nodes" in said, said
    assert "fix: where the site allows ssh: ssh -t h2 " in said, said
