"""Real Slurm in the lab (`multihost lab up 2 --slurm`): slurmctld on ctl, slurmd and
munged on h1 and h2, and multihost inside an allocation of it."""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from multihost.lab import Lab

from conftest import LabHandle, lab_unavailable, random_name
from test_run import SLEEPER, leftovers, run_id_in
from test_run import paddle_python  # noqa: F401 (the cached paddle venv: MULTIHOST_TEST_PADDLE=1)


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory) -> Path:
    """A directory every lab host sees at the same path (as a cluster's shared home)."""
    path = tmp_path_factory.mktemp("slurmshare")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def slurm_lab(shared_dir) -> Iterator[LabHandle]:
    reason = lab_unavailable() or next(
        (f"`{tool}` is not installed (slurm-wlm, munge)" for tool in ("slurmctld", "slurmd", "munged")
         if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin")), None)
    if reason:
        pytest.skip(f"no Slurm lab on this machine: {reason}")
    the_lab = Lab(random_name("mhs"))
    atexit.register(the_lab.down)
    the_lab.up(2, with_slurm=True, shares=[str(shared_dir)])
    try:
        yield LabHandle(the_lab, 2)
    finally:
        the_lab.down()
        atexit.unregister(the_lab.down)


def lab_processes(lab: LabHandle, names=("slurm", "munged", "srun")) -> list:
    """Every process of the machine whose command names one of ``names`` and that runs in
    one of this lab's namespaces (other labs may run beside it)."""
    found = []
    inodes = set()
    for ns in os.listdir("/run/netns"):
        if ns.startswith(lab.name + "-"):
            inodes.add(os.stat(f"/run/netns/{ns}").st_ino)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            net = int(os.readlink(f"/proc/{pid}/ns/net")[5:-1])
            args = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if net in inodes and any(n in args for n in names):
            found.append(args)
    return found


def sleeper_code(tmp_path: Path) -> Path:
    """A code directory holding test_run's SLEEPER as sleeper.py."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "sleeper.py").write_text(SLEEPER)
    return code


def cmdline(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""


def lab_pids(parent: int) -> list:
    """``parent``'s children, seen from this machine."""
    kids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == parent:
            kids.append(int(pid))
    return kids


def test_srun_inside_salloc_answers_from_both_hosts_in_order(slurm_lab):
    # Lines come as the tasks print them; -l labels each with its task number.
    r = slurm_lab.run(["salloc", "-N", "2", "srun", "-l", "-N", "2", "hostname"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["0: h1", "1: h2"]
    r = slurm_lab.run(["sinfo", "-h", "-o", "%D %T %N"], check=True)
    assert r.stdout.split() == ["2", "idle", "h[1-2]"]


def test_every_daemon_runs_inside_the_lab_and_down_leaves_nothing():
    if lab_unavailable() or not shutil.which("slurmctld", path="/usr/sbin:/usr/bin"):
        pytest.skip("no Slurm lab on this machine")
    lab = Lab(random_name("mhs"))
    atexit.register(lab.down)
    try:
        lab.up(1, with_slurm=True)
        handle = LabHandle(lab, 1)
        daemons = lab_processes(handle, ("slurmctld", "slurmd", "munged"))
        assert sorted(a.split()[0].rsplit("/", 1)[-1] for a in daemons) == \
            ["munged", "munged", "slurmctld", "slurmd"]
        assert handle.run(["hostname"], check=True).stdout.strip() == "ctl"
        # The machine's own /etc/slurm is not the lab's: nothing was written outside.
        assert not os.path.exists("/etc/slurm/slurm.conf")
    finally:
        lab.down()
        atexit.unregister(lab.down)
    assert not any(ns.startswith(lab.name + "-") for ns in os.listdir("/run/netns"))
    assert not lab.dir.exists()
    leftover = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(lab.dir) not in leftover


def test_node_lists_expand_as_the_real_scontrol_does(slurm_lab):
    from multihost.slurm import expand_nodelist

    lists = ["h[1-3,5],g7", "linux[0-6,128]", "node[08-11]", "rack[0-1]_blade[0-1]",
             "tux[7,3-4]", "gpu-node-[001-002]", "a[01-3]"]
    for text in lists:
        real = slurm_lab.run(["scontrol", "show", "hostnames", text], check=True).stdout.split()
        assert list(expand_nodelist(text, scontrol="")) == real, text


def test_inside_salloc_the_allocation_is_read_in_slurms_order(slurm_lab):
    code = ("from multihost.slurm import current; a = current(); "
            "print(a.job_id.isdigit(), ' '.join(a.nodes), a.gpus, a.in_step)")
    r = slurm_lab.run(["salloc", "-N", "2", sys.executable, "-c", code], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "h1", "h2", "None", "False"]


def in_allocation(lab: LabHandle, script: str, nodes: int = 2, timeout: float = 180):
    """``script`` (a shell line) as salloc's command on ctl: it runs where a user types
    after `salloc -N 2`, with multihost of this checkout on PATH."""
    return lab.run(["salloc", "-N", str(nodes), "sh", "-c", script], timeout=timeout)


def test_exec_inside_salloc_reaches_the_nodes_through_srun(slurm_lab):
    # No --ips: the allocation's nodes, in Slurm's order, each command a job step (no
    # ssh login: no SSH_CONNECTION), started at home as a login would be.
    r = in_allocation(slurm_lab, "multihost exec -- "
                                 "'echo $(hostname) step=$SLURM_STEP_ID ssh=$SSH_CONNECTION home=$HOME $PWD'")
    assert r.returncode == 0, r.stderr
    lines = [l.split() for l in r.stdout.splitlines() if " step=" in l]
    assert [l[0] for l in lines] == ["h1", "h2"]
    for line in lines:
        assert line[1].startswith("step=") and line[1][5:].isdigit(), line
        assert line[2:] == ["ssh=", "home=/root", "/root"], line


def test_a_failing_node_command_gives_its_exit_code_and_only_its_own_stderr(slurm_lab):
    r = in_allocation(slurm_lab, "multihost exec -- 'echo oops >&2; exit 3'")
    assert r.returncode == 3
    assert "oops" in r.stdout + r.stderr and "srun: error" not in r.stdout + r.stderr


def test_transport_ssh_reaches_the_same_nodes_over_ssh(slurm_lab):
    r = in_allocation(slurm_lab, "multihost exec --transport ssh -- 'echo $SSH_CONNECTION'")
    assert r.returncode == 0, r.stderr
    assert "198.18.0.1 " in r.stdout   # a login from ctl, not a step


def test_check_inside_salloc_probes_every_node_through_srun(slurm_lab):
    r = in_allocation(slurm_lab, "multihost check")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [l.split() for l in r.stdout.splitlines() if l[:1].isdigit()]
    assert [row[:2] for row in rows] == [["0", "h1"], ["1", "h2"]]
    assert "ready: 2 hosts" in r.stdout


# -- multihost run inside an allocation ---------------------------------------------------
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


def test_run_inside_salloc_puts_ranks_in_slurms_node_order(slurm_lab, tmp_path):
    r = in_allocation(slurm_lab, f"multihost run --nproc_per_node 2 --code {EXAMPLES} "
                                 f"--log_dir {tmp_path / 'log'} --plain -- ranks.py", timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    seen = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = re.search(r"host=(h\d) rank=(\d) local_rank=(\d) world_size=(\d) .* node_rank=(\d)", line)
        if m:
            seen[int(m.group(2))] = (m.group(1), int(m.group(3)), int(m.group(4)), int(m.group(5)))
    assert seen == {0: ("h1", 0, 4, 0), 1: ("h1", 1, 4, 0), 2: ("h2", 0, 4, 1), 3: ("h2", 1, 4, 1)}
    assert (r.stdout + r.stderr).count("all_reduce sum=10 expected=10 ok") == 4


def test_a_failing_rank_inside_salloc_is_the_root_cause_and_nothing_is_left(slurm_lab, tmp_path):
    code = sleeper_code(tmp_path)
    r = in_allocation(slurm_lab, f"multihost run --nproc_per_node 2 --code {code} --no-check "
                                 f"--kill-wait 2 --plain --log_dir {tmp_path / 'log'} "
                                 "-- sleeper.py 3 2", timeout=240)
    assert r.returncode == 3, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    if last.startswith("salloc:"):
        last = [l for l in r.stderr.strip().splitlines() if l.startswith("multihost:")][-1]
    assert last.startswith("multihost: h2: run ") and "rank 3 (local rank 1): exit 3" in last, last
    assert "rank 3 fails now" in r.stderr
    assert leftovers(slurm_lab, 2, run_id_in(r.stderr)) == {}


def test_ctrl_c_inside_salloc_leaves_nothing_on_any_node_and_ends_the_job(slurm_lab, tmp_path):
    code = sleeper_code(tmp_path)
    proc = slurm_lab.popen(["salloc", "-N", "2", "multihost", "run", "--launcher", "python",
                            "--nproc_per_node", "2", "--code", str(code), "--no-check",
                            "--kill-wait", "2", "--plain", "--log_dir", str(tmp_path / "log"),
                            "--", "sleeper.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:     # both nodes' ranks up (the sleeper prints once per rank)
            found = [slurm_lab.host_run(i, ["pgrep", "-f", "sleeper.py"]).stdout.split()
                     for i in (1, 2)]
            if all(len(pids) >= 2 for pids in found):
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
            time.sleep(0.5)
        # A terminal's Ctrl-C goes to salloc's command (salloc gives it the terminal),
        # not to salloc: the same signal to the controller alone.
        controller = [pid for pid in lab_pids(proc.pid) if b"multihost" in cmdline(pid)][0]
        os.kill(controller, signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "stopped on every host (interrupted)" in err, err[-2000:]
    assert leftovers(slurm_lab, 2, run_id_in(err)) == {}
    queue = slurm_lab.run(["squeue", "-h", "-o", "%i %T"], check=True).stdout.strip()
    assert queue == "", queue


# -- multihost run --slurm, from outside an allocation -------------------------------------
def test_run_slurm_asks_for_the_nodes_runs_and_releases_them(slurm_lab, tmp_path):
    r = slurm_lab.multihost("run", "--slurm", "-N", "2", "--nproc_per_node", "2", "--code",
                            str(EXAMPLES), "--log_dir", str(tmp_path / "log"), "--plain", "--",
                            "ranks.py", timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert re.search(r"Slurm job \d+: nodes h\[1-2\]", r.stderr)
    assert (r.stdout + r.stderr).count("all_reduce sum=10 expected=10 ok") == 4
    assert slurm_lab.run(["squeue", "-h"], check=True).stdout.strip() == ""   # released


def test_a_queued_run_slurm_shows_in_status_and_starts_when_the_nodes_free(slurm_lab, tmp_path):
    holder = slurm_lab.popen(["salloc", "-N", "2", "sleep", "8"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert "Granted job allocation" in holder.stderr.readline()
        run = slurm_lab.popen([sys.executable, "-m", "multihost", "run", "--slurm", "-N", "2",
                               "--nproc_per_node", "1", "--code", str(EXAMPLES), "--plain",
                               "--log_dir", str(tmp_path / "log"), "--", "ranks.py"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while True:
                shown = slurm_lab.multihost("status", timeout=60).stdout
                if shown.startswith("queued (Slurm job "):
                    break
                assert time.monotonic() < deadline, shown
                time.sleep(0.3)
            assert re.match(r"queued \(Slurm job \d+, (Resources|Priority)\)", shown), shown
            out, err = run.communicate(timeout=240)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        assert run.returncode == 0, err[-3000:]
        assert holder.wait(30) == 0        # the holder ended first: the run waited for it
        assert (out + err).count("all_reduce sum=3 expected=3 ok") == 2
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert slurm_lab.run(["squeue", "-h"], check=True).stdout.strip() == ""


def test_run_in_an_sbatch_script_runs_on_the_allocation(slurm_lab, shared_dir):
    script = shared_dir / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N 2\n"
                      f"multihost run --nproc_per_node 2 --code {EXAMPLES} --plain -- ranks.py\n"
                      "echo rc=$?\n")
    r = slurm_lab.run(["sbatch", "--wait", "-D", str(shared_dir), "-o", str(shared_dir / "out-%j.txt"),
                       str(script)], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    job = re.search(r"Submitted batch job (\d+)", r.stdout).group(1)
    out = (shared_dir / f"out-{job}.txt").read_text()
    assert out.count("all_reduce sum=10 expected=10 ok") == 4 and "rc=0" in out, out[-3000:]
    assert re.search(r"h1 \[0\]: host=h1 rank=0 ", out) and re.search(r"h2 \[3\]: host=h2 rank=3 ", out)



def test_paddle_inside_salloc_gives_trainer_ids_and_endpoints_in_slurms_order(slurm_lab, tmp_path,
                                                                           paddle_python):
    r = in_allocation(slurm_lab, f"multihost run --python {paddle_python} --launcher paddle "
                                 f"--nproc_per_node 2 --start-port 17100 --code {EXAMPLES} --plain "
                                 f"--log_dir {tmp_path / 'log'} -- ranks.py", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = {}
    for line in r.stdout.splitlines():
        m = re.search(r"^(\S+) \[\d+\]: paddle trainer_id=(\d) endpoint=(\S+) endpoints=(\S+)", line)
        if m:
            seen[int(m.group(2))] = (m.group(1), m.group(3), m.group(4))
    expected = "198.18.0.11:17100,198.18.0.11:17101,198.18.0.12:17100,198.18.0.12:17101"
    assert {t: v[:2] for t, v in seen.items()} == {
        0: ("h1", "198.18.0.11:17100"), 1: ("h1", "198.18.0.11:17101"),
        2: ("h2", "198.18.0.12:17100"), 3: ("h2", "198.18.0.12:17101")}
    assert {v[2] for v in seen.values()} == {expected}
    assert len(re.findall(r"(?m)^\S+ \[\d\]: all_reduce sum=10 expected=10 ok$", r.stdout)) == 4


def test_a_crashed_rank_inside_salloc_restarts_from_its_checkpoint(slurm_lab, tmp_path):
    r = in_allocation(slurm_lab, f"multihost run --max-restarts 1 --nproc_per_node 2 --code {EXAMPLES} "
                                 f"--plain --log_dir {tmp_path / 'log'} -- train_ddp.py --epochs 2 "
                                 "--steps 40 --crash-at 30 --checkpoint-dir ckpt", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # The crash is the last rank's (h2), not a peer's whose all-reduce lost it, nor the
    # neighbour torchrun ended with SIGTERM (each can be recorded first on a loaded machine).
    assert re.search(r"attempt 1 of 2 failed: h2 \(node 1\) rank 3: exit 1; restarting", r.stderr), \
        r.stderr[-3000:]
    assert re.search(r"run \S+ succeeded", r.stderr)


def test_a_hung_run_inside_salloc_has_every_ranks_stack_taken_through_srun(slurm_lab, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "quiet.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    r = in_allocation(slurm_lab, f"multihost run --launcher python --nproc_per_node 2 --code {code} "
                                 f"--no-check --hang-timeout 8 --plain --log_dir {tmp_path / 'log'} "
                                 "-- quiet.py", timeout=240)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "hung: no rank wrote a line for 8s" in r.stderr
    stacks = next((tmp_path / "log").glob("*/stacks-0.txt")).read_text()
    assert stacks.startswith("ranks 0-3 (4 rank(s) on h1, h2):") and "quiet.py\", line 3" in stacks
    assert leftovers(slurm_lab, 2, run_id_in(r.stderr)) == {}


def test_scancel_of_the_allocation_ends_every_rank_on_every_node(slurm_lab, tmp_path):
    # Each node's supervisor lives in a job step that lasts as long as the run, so Slurm
    # itself ends the ranks: a supervisor detached as over ssh would escape the step and
    # keep them running after scancel.
    code = sleeper_code(tmp_path)
    r = in_allocation(slurm_lab, f"multihost run --launcher python --nproc_per_node 2 --code {code} "
                                 f"--no-check --plain --log_dir {tmp_path / 'log'} -- sleeper.py "
                                 ">/dev/null 2>&1 & "
                                 "until [ \"$(srun --overlap -N2 -n2 pgrep -c -f sleeper.py | "
                                 "awk '{s+=$1} END {print s+0}')\" -ge 4 ]; do sleep 0.5; done; "
                                 "scancel $SLURM_JOB_ID; wait", timeout=240)
    deadline = time.monotonic() + 60
    while True:
        left = {i: slurm_lab.host_run(i, ["pgrep", "-af", "sleeper.py|run_supervisor|slurm.launch"]).stdout
                for i in (1, 2)}
        # The job itself leaves the queue once each node's slurmd has reported its steps
        # ended (it shows CG, completing, until then).
        left["queue"] = slurm_lab.run(["squeue", "-h"], check=True).stdout.strip()
        if not any(left.values()):
            break
        assert time.monotonic() < deadline, left
        time.sleep(0.5)


def test_status_and_stop_from_another_shell_reach_the_nodes_through_srun(slurm_lab, tmp_path):
    # The nodes' sshd is stopped: only srun can reach them now.
    code = sleeper_code(tmp_path)
    for i in (1, 2):
        slurm_lab.lab.sshd_stop(i)
    try:
        r = in_allocation(slurm_lab, f"multihost run --launcher python --nproc_per_node 2 --code {code} "
                                     f"--no-check --detach --plain --log_dir {tmp_path / 'log'} "
                                     "-- sleeper.py && sleep 3 && multihost status --plain; "
                                     "multihost stop; echo stop=$?", timeout=240)
    finally:
        for i in (1, 2):
            slurm_lab.lab.sshd_start(i)
    assert "stop=0" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    assert re.search(r"h1\s.*running", r.stdout) and re.search(r"h2\s.*running", r.stdout), r.stdout
    assert leftovers(slurm_lab, 2, run_id_in(r.stderr)) == {}
