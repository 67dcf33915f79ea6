"""`multihost run --slurm --detach` on real Slurm: the run is a batch job, and `status`,
`logs --follow` and `stop` from the login node (the lab's ctl) follow and end it."""
from __future__ import annotations

import re
import subprocess
import time

from test_run import SLEEPER, leftovers, run_id_in
from test_slurm import EXAMPLES, shared_dir, slurm_lab  # noqa: F401 (fixtures)


def submit(lab, cwd, *args):
    started = time.monotonic()
    r = lab.multihost("run", "--slurm", "-N", "2", "--detach", *args, timeout=60, cwd=str(cwd))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert time.monotonic() - started < 20    # submitted, not waited for
    job = re.match(r"submitted as Slurm job (\d+) \(2 nodes\); output: (\S+)\n", r.stdout)
    assert job, r.stdout
    return job.group(1), job.group(2)


def status_until(lab, cwd, pattern, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        shown = lab.multihost("status", timeout=60, cwd=str(cwd)).stdout.strip()
        if re.fullmatch(pattern, shown):
            return shown
        assert time.monotonic() < deadline, shown
        time.sleep(0.3)


def test_a_detached_slurm_run_is_a_batch_job_shown_queued_running_and_followed_to_its_end(
        slurm_lab, shared_dir):
    holder = slurm_lab.popen(["salloc", "-N", "2", "sleep", "5"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert "Granted job allocation" in holder.stderr.readline()
        job, output = submit(slurm_lab, shared_dir, "--nproc_per_node", "2", "--code",
                             str(EXAMPLES), "--", "ranks.py")
        assert output == f"{shared_dir}/slurm-{job}.out"     # Slurm's default, where it was submitted
        status_until(slurm_lab, shared_dir, rf"queued \(Slurm job {job}, (Resources|Priority)\)")
        status_until(slurm_lab, shared_dir,
                     rf"running as Slurm job {job} on h\[1-2\]; output: {re.escape(output)}")
        r = slurm_lab.multihost("logs", "--follow", timeout=120, cwd=str(shared_dir))
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert r.stdout.count("all_reduce sum=10 expected=10 ok") == 4, r.stdout[-3000:]
    assert r.stdout.splitlines()[-1] == f"Slurm job {job} ended: COMPLETED, exit 0; output: {output}"
    assert slurm_lab.run(["squeue", "-h"], check=True).stdout.strip() == ""
    assert slurm_lab.multihost("status", cwd=str(shared_dir)).stdout.startswith(
        f"Slurm job {job} ended: COMPLETED, exit 0")


def test_stop_ends_a_detached_slurm_run_on_every_node(slurm_lab, shared_dir):
    code = shared_dir / "sleeper"
    code.mkdir(exist_ok=True)
    (code / "sleeper.py").write_text(SLEEPER)
    job, output = submit(slurm_lab, shared_dir, "--launcher", "python", "--nproc_per_node", "2",
                         "--code", str(code), "--no-check", "--kill-wait", "2", "--",
                         "sleeper.py")
    deadline = time.monotonic() + 40
    while True:     # both nodes' ranks up
        found = [slurm_lab.host_run(i, ["pgrep", "-f", "sleeper.py"]).stdout.split() for i in (1, 2)]
        if all(len(pids) >= 2 for pids in found):
            break
        assert time.monotonic() < deadline, found
        time.sleep(0.5)
    run_id = run_id_in(open(output).read())
    r = slurm_lab.multihost("stop", timeout=90, cwd=str(shared_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"Slurm job {job} ended: CANCELLED"), r.stdout
    assert f"(scancel {job}); output: {output}" in r.stdout
    assert leftovers(slurm_lab, 2, run_id) == {}
    assert slurm_lab.run(["squeue", "-h"], check=True).stdout.strip() == ""
