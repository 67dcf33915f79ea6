"""Under paddle's launcher (and in a parameter-server job) multihost itself records how
every trainer and server ended: the root cause names the rank that died first (global
rank, exit code or signal), and the ranks that died after it are named as such, never
paddle's word for it (its launcher names the local rank that aborted after its peer).

Real paddlepaddle, 2 lab hosts: MULTIHOST_TEST_PADDLE=1 (see test_run.paddle_python).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from test_paddle import PS_TRAIN, ps_python  # noqa: F401 (fixture)
from test_run import hostfile, leftovers, paddle_python, run_started_by  # noqa: F401 (fixture)

# Data-parallel training that goes on until it is stopped: every step all-reduces the
# gradients across both hosts, so a dead trainer stalls (and fails) its peers.
TRAIN = textwrap.dedent("""\
    import argparse
    import sys
    import time

    import paddle
    import paddle.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-step", type=int, default=5)
    args = parser.parse_args()
    dist.init_parallel_env()
    rank = dist.get_rank()
    model = paddle.DataParallel(paddle.nn.Linear(4, 1))
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    for step in range(100000):
        if rank == args.fail_rank and step == args.fail_step:
            print("trainer %d fails at step %d" % (rank, step), flush=True)
            sys.exit(3)
        x = paddle.randn([8, 4])
        loss = ((model(x) - x.sum(axis=1, keepdim=True)) ** 2).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        print("trainer %d step %d loss %.4f" % (rank, step, float(loss)), flush=True)
        time.sleep(0.2)
""")


@pytest.fixture
def train_code(tmp_path: Path) -> Path:
    directory = tmp_path / "code"
    directory.mkdir()
    (directory / "train.py").write_text(TRAIN)
    (directory / "ps_train.py").write_text(PS_TRAIN)
    return directory


def start(lab, tmp_path, *args: str) -> tuple:
    """`multihost ARGS` started in the background, its output to files; (proc, run id)."""
    out, err = open(tmp_path / "out.txt", "w"), open(tmp_path / "err.txt", "w")
    proc = lab.popen([sys.executable, "-m", "multihost", *args], stdout=out, stderr=err,
                     stdin=subprocess.DEVNULL)
    return proc, run_started_by(lab, proc, timeout=120)


def finish(proc, tmp_path, timeout: float = 120) -> tuple:
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()


def on_host(lab, i: int, run_id: str, name: str) -> Path:
    return lab.host_path(i, f"/root/.multihost/runs/{run_id}/{name}")


def wait_for(what, timeout: float, message: str):
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found:
            return found
        assert time.monotonic() < deadline, message
        time.sleep(0.2)


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_collective(lab, tmp_path, paddle_python, train_code, port: str, *script_args: str):
    hosts = hostfile(lab, tmp_path, 2)
    return start(lab, tmp_path, "run", "--hostfile", str(hosts), "--python", paddle_python,
                 "--launcher", "paddle", "--nproc_per_node", "2", "--start-port", port,
                 "--code", str(train_code), "--plain", "--kill-wait", "3",
                 "--log_dir", str(tmp_path / "log"), "--", "train.py", *script_args)


def cause_and_after(stderr: str) -> tuple:
    """The root-cause line and the lines naming who stopped after it."""
    cause = re.search(r"(?m)^multihost: run \S+ failed; root cause: (.*)$", stderr)
    assert cause, stderr[-3000:]
    return cause.group(1), re.findall(r"(?m)^  then (.*)$", stderr)


def assert_stopped_after(after, who: str, expected: dict) -> None:
    """``expected``: {host: ranks}; each named once, as stopped after ``who``."""
    named = {}
    for line in after:
        match = re.match(r"(\S+) \(node \d\) (ranks?|parameter servers?) ([\d, ]+): ", line)
        assert match and line.endswith(f"stopped after {who} failed"), line
        if match.group(2).startswith("rank"):
            named.setdefault(match.group(1), []).extend(
                int(n) for n in match.group(3).split(", "))
    assert {host: sorted(ranks) for host, ranks in named.items()} == expected, after


def test_a_paddle_trainer_killed_by_pid_is_the_root_cause_and_its_peers_stopped_after_it(
        lab, tmp_path, paddle_python, train_code):
    a, b = lab.address(1), lab.address(2)
    proc, run_id = run_collective(lab, tmp_path, paddle_python, train_code, "17500")
    record = on_host(lab, 2, run_id, "rank.1.json")    # global rank 3: the second host's
    log = on_host(lab, 2, run_id, "log/workerlog.1")
    wait_for(lambda: log.is_file() and "trainer 3 step 3 " in log.read_text(), 120,
             "rank 3 never trained")
    pid = read_json(record)["pid"]
    assert "train.py" in lab.host_run(2, ["cat", f"/proc/{pid}/cmdline"]).stdout
    lab.host_run(2, ["kill", "-9", str(pid)], check=True)
    code, out, err = finish(proc, tmp_path)
    cause, after = cause_and_after(err)
    assert code == 137, err[-3000:]
    assert cause.startswith(f"{b} (node 1) rank 3: killed by SIGKILL"), cause
    assert_stopped_after(after, "rank 3", {a: [0, 1], b: [2]})
    assert leftovers(lab, 2, run_id) == {}


def test_a_paddle_trainer_that_exits_3_is_the_root_cause_and_its_peers_stopped_after_it(
        lab, tmp_path, paddle_python, train_code):
    a, b = lab.address(1), lab.address(2)
    proc, run_id = run_collective(lab, tmp_path, paddle_python, train_code, "17520",
                                  "--fail-rank", "3", "--fail-step", "5")
    code, out, err = finish(proc, tmp_path, timeout=240)
    cause, after = cause_and_after(err)
    assert code == 3, err[-3000:]
    assert cause == f"{b} (node 1) rank 3: exit 3", cause
    assert "  | trainer 3 fails at step 5" in err            # its own last lines
    assert_stopped_after(after, "rank 3", {a: [0, 1], b: [2]})
    status = json.loads(lab.multihost("status", run_id, "--json").stdout)
    assert status["root_cause"]["rank"] == 3 and status["root_cause"]["after"] == after
    assert leftovers(lab, 2, run_id) == {}


def test_a_parameter_server_killed_by_pid_is_the_root_cause_not_the_trainers_after_it(
        lab, tmp_path, ps_python, train_code):
    a, b = lab.address(1), lab.address(2)
    proc, run_id = start(
        lab, tmp_path, "fleetrun", "--python", ps_python, "--code", str(train_code), "--plain",
        "--kill-wait", "3", "--log_dir", str(tmp_path / "log"), "--env", "PADDLE_WITH_GLOO=1",
        "--start_port", "17540", f"--servers={a}:17540,{b}:17540", f"--workers={a},{a},{b},{b}",
        "ps_train.py", "--steps", "100000", "--step-sleep", "0.1")
    node = on_host(lab, 2, run_id, "node.json")
    log = on_host(lab, 2, run_id, "log/workerlog.1")
    wait_for(lambda: log.is_file() and "trainer 3 step 3 " in log.read_text(), 120,
             "trainer 3 never trained")
    (server,) = read_json(node)["servers"]                 # parameter server 1, on b
    assert server["rank"] == 1
    lab.host_run(2, ["kill", "-9", str(server["pid"])], check=True)
    code, out, err = finish(proc, tmp_path)
    cause, after = cause_and_after(err)
    assert code == 137, err[-3000:]
    assert cause.startswith(f"{b} (node 1): parameter server 1 killed by SIGKILL"), cause
    assert_stopped_after(after, "parameter server 1", {a: [0, 1], b: [2, 3]})
    assert leftovers(lab, 2, run_id) == {}
