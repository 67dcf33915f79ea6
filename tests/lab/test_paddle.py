"""Paddle users first, end to end in the lab with real paddlepaddle (CPU, gloo): the
headline command without --launcher, `multihost fleetrun` with fleetrun's own flags,
each line shown once.

These need MULTIHOST_TEST_PADDLE=1 (a cached venv with paddlepaddle from PyPI; see
test_run.paddle_python).
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from conftest import cached_venv
from test_run import hostfile, leftovers, paddle_python, run_id_in  # noqa: F401 (fixture)

PS_VENV_DEFAULT = "/var/cache/multihost-tests/paddle-ps-venv"   # hosts see /var (not /tmp)
# paddlepaddle 3.x's CPU wheel has no parameter-server core; 2.6.2 has, and needs numpy<2
# and protobuf 4.x (protobuf 7 breaks DistributedStrategy).
PS_PACKAGES = ["paddlepaddle==2.6.2", "numpy<2", "protobuf>=4,<5"]

# A real Paddle data-parallel program: every trainer draws its own batches, DataParallel
# all-reduces the gradients across hosts, so every trainer ends with the same weights.
TRAIN = textwrap.dedent("""\
    import paddle
    import paddle.distributed as dist

    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    paddle.seed(0)
    model = paddle.DataParallel(paddle.nn.Linear(4, 1))
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    paddle.seed(1 + rank)
    for step in range(5):
        x = paddle.randn([8, 4])
        loss = ((model(x) - x.sum(axis=1, keepdim=True)) ** 2).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        print("trainer %d step %d loss %.4f" % (rank, step, float(loss)), flush=True)
    weights = model.parameters()[0].numpy().ravel()
    print("trainer %d of %d weights %s" % (rank, world, ",".join("%.5f" % v for v in weights)),
          flush=True)
""")


@pytest.fixture
def paddle_code(tmp_path: Path) -> Path:
    directory = tmp_path / "code"
    directory.mkdir()
    (directory / "train.py").write_text(TRAIN)
    return directory


def weights_by_trainer(stdout: str) -> dict:
    found = {}
    for match in re.finditer(r"(?m)^(\S+) \[\d+\]: trainer (\d) of (\d) weights (\S+)$", stdout):
        host, trainer, world, weights = match.groups()
        found[int(trainer)] = (host, int(world), weights)
    return found


def test_a_paddle_script_runs_under_paddles_launcher_without_launcher_flag(
        lab, tmp_path, paddle_python, paddle_code):
    hosts = hostfile(lab, tmp_path, 2)
    result = lab.multihost("run", "--hostfile", str(hosts), "--python", paddle_python,
                           "--nproc_per_node", "2", "--start-port", "17200", "--code",
                           str(paddle_code), "--plain", "--log_dir", str(tmp_path / "log"),
                           "--", "train.py", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "multihost: launcher paddle: train.py imports paddle, not torch" in result.stderr
    found = weights_by_trainer(result.stdout)
    assert sorted(found) == [0, 1, 2, 3], result.stdout[-3000:]
    assert {world for _, world, _ in found.values()} == {4}
    assert len({weights for _, _, weights in found.values()}) == 1   # gradients all-reduced
    assert [found[t][0] for t in range(4)] == [lab.address(1)] * 2 + [lab.address(2)] * 2
    # Local rank 0's lines are shown once: paddle's launcher echoes them in its own output.
    for trainer in range(4):
        assert len(re.findall(rf"(?m)^\S+ \[[^\]]+\]: trainer {trainer} of 4 weights",
                              result.stdout)) == 1, result.stdout[-3000:]
    assert re.search(r"(?m)^\S+ \[launcher\]: ", result.stdout)   # its own messages stay
    assert leftovers(lab, 2, run_id_in(result.stderr)) == {}


# -- parameter-server jobs: `multihost fleetrun` with paddle 2.6's fleet PS API -------------
@pytest.fixture(scope="session")
def ps_python() -> str:
    """A cached venv with paddlepaddle 2.6.2 (MULTIHOST_PADDLE_PS_VENV picks where)."""
    import os

    if os.environ.get("MULTIHOST_TEST_PADDLE") != "1":
        pytest.skip("set MULTIHOST_TEST_PADDLE=1 to test parameter-server jobs")
    venv = Path(os.environ.get("MULTIHOST_PADDLE_PS_VENV", PS_VENV_DEFAULT))
    return cached_venv(venv, PS_PACKAGES, "import paddle.distributed.fleet")


# A real parameter-server program on paddle's fleet API (static graph, CPU, geo mode):
# the servers hold a linear model's weights, each trainer trains on its own batches and
# syncs with them every 2 steps; at the end every trainer's eval loss is averaged over
# the trainers through gloo (the http rendezvous on --http_port), the same everywhere.
PS_TRAIN = textwrap.dedent("""\
    import argparse
    import sys
    import time

    import numpy as np
    import paddle
    import paddle.distributed.fleet as fleet

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fail-trainer", type=int, default=-1)
    parser.add_argument("--fail-step", type=int, default=5)
    parser.add_argument("--no-gloo", action="store_true", help="skip the mean over trainers")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds a step")
    args = parser.parse_args()

    paddle.enable_static()
    paddle.static.default_startup_program().random_seed = 1   # the same start everywhere
    fleet.init()
    x = paddle.static.data(name="x", shape=[None, 4], dtype="float32")
    y = paddle.static.data(name="y", shape=[None, 1], dtype="float32")
    loss = paddle.mean((paddle.static.nn.fc(x, size=1) - y) ** 2)
    test_program = paddle.static.default_main_program().clone(for_test=True)
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    strategy.a_sync_configs = {"k_steps": 2}     # geo: train locally, sync every 2 steps
    optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.05), strategy)
    optimizer.minimize(loss)

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        sys.exit(0)

    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    me = fleet.worker_index()
    weights = np.array([[1.0], [2.0], [3.0], [4.0]], dtype="float32")
    rng = np.random.RandomState(me)
    for step in range(args.steps):
        if me == args.fail_trainer and step == args.fail_step:
            print("trainer %d fails at step %d" % (me, step), flush=True)
            sys.exit(3)
        batch = rng.rand(16, 4).astype("float32")
        value, = exe.run(paddle.static.default_main_program(),
                         feed={"x": batch, "y": batch @ weights}, fetch_list=[loss])
        print("trainer %d step %d loss %.4f" % (me, step, float(np.mean(value))), flush=True)
        time.sleep(args.step_sleep)
    fleet.barrier_worker()
    fixed = np.random.RandomState(1234).rand(64, 4).astype("float32")
    final, = exe.run(test_program, feed={"x": fixed, "y": fixed @ weights}, fetch_list=[loss])
    # every trainer's eval loss, averaged over the trainers through gloo: one number everywhere
    mean = float("nan") if args.no_gloo else \
        fleet.util.all_reduce(np.array([float(np.mean(final))]), "sum")[0] / fleet.worker_num()
    print("trainer %d of %d done: eval loss %.4f mean eval loss %.6f"
          % (me, fleet.worker_num(), float(np.mean(final)), mean), flush=True)
    fleet.stop_worker()
""")


@pytest.fixture
def ps_code(tmp_path: Path) -> Path:
    directory = tmp_path / "pscode"
    directory.mkdir()
    (directory / "ps_train.py").write_text(PS_TRAIN)
    return directory


def fleetrun(lab, tmp_path, ps_python, ps_code, *flags, timeout=300, gloo=True):
    return lab.multihost("fleetrun", "--python", ps_python, "--code", str(ps_code), "--plain",
                         "--kill-wait", "3", "--log_dir", str(tmp_path / "log"),
                         "--env", f"PADDLE_WITH_GLOO={1 if gloo else 0}", *flags, timeout=timeout)


def test_a_ps_job_on_two_machines_trains_to_the_end_with_one_metric_everywhere(
        lab, tmp_path, ps_python, ps_code):
    a, b = lab.address(1), lab.address(2)
    result = fleetrun(lab, tmp_path, ps_python, ps_code, "--start_port", "17400",
                      f"--servers={a}:17400,{b}:17400", f"--workers={a},{a},{b},{b}",
                      "ps_train.py", "--steps", "20")
    assert result.returncode == 0, result.stderr[-3000:]
    done = re.findall(r"(?m)^(\S+) \[(\d)\]: trainer (\d) of 4 done: eval loss \S+ "
                      r"mean eval loss (\S+)$", result.stdout)
    assert sorted(int(t) for _, _, t, _ in done) == [0, 1, 2, 3], result.stdout[-3000:]
    assert len({mean for _, _, _, mean in done}) == 1          # the same metric everywhere
    assert {(host, rank) for host, rank, _, _ in done} == \
        {(a, "0"), (a, "1"), (b, "2"), (b, "3")}                # trainer ids in machine order
    # labelled by role and their index across the job: two servers, never two "server 0"
    assert re.search(rf"(?m)^{re.escape(a)} \[server 0\]: ", result.stdout)
    assert re.search(rf"(?m)^{re.escape(b)} \[server 1\]: ", result.stdout)
    run_id = run_id_in(result.stderr)
    assert leftovers(lab, 2, run_id) == {}                      # servers stopped on both
    servers = lab.multihost("logs", run_id, "--role", "server", "--plain")
    assert servers.returncode == 0 and servers.stdout
    assert all(" [server " in line for line in servers.stdout.strip().splitlines())
    assert f"{b} [server 1]: " in servers.stdout and f"{b} [server 0]: " not in servers.stdout


def test_a_ps_trainer_that_fails_mid_run_fails_the_run_naming_it_and_leaves_nothing(
        lab, tmp_path, ps_python, ps_code):
    a, b = lab.address(1), lab.address(2)
    result = fleetrun(lab, tmp_path, ps_python, ps_code, "--start_port", "17420",
                      f"--ips={a},{b}", "--server_num=1", "--worker_num=2",
                      "ps_train.py", "--steps", "200", "--step-sleep", "0.05",
                      "--fail-trainer", "2", "--fail-step", "5")
    # The other trainers are still training when trainer 2 fails (0.05 s a step): none of
    # them reaches the end-of-training barrier and fails there on its own, first.
    assert result.returncode == 3, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"multihost: {b}: ") and "rank 2" in last and "exit 3" in last, last
    assert "trainer 2 fails at step 5" in result.stdout
    assert leftovers(lab, 2, run_id_in(result.stderr)) == {}


def test_fleetrun_with_the_reference_ips_command_runs_a_collective_job(
        lab, tmp_path, paddle_python, paddle_code):
    # fleetrun-usage.rst: fleetrun --ips="xx.xx.xx.xx,yy.yy.yy.yy" train.py (CPU: one each)
    a, b = lab.address(1), lab.address(2)
    result = lab.multihost("fleetrun", "--python", paddle_python, "--code", str(paddle_code),
                           "--plain", "--log_dir", str(tmp_path / "log"), "--start_port", "17240",
                           f'--ips={a},{b}', "train.py", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = weights_by_trainer(result.stdout)
    assert sorted(found) == [0, 1] and [found[0][0], found[1][0]] == [a, b]
    assert len({weights for _, _, weights in found.values()}) == 1


def test_fleetrun_server_and_worker_counts_run_on_this_machine_alone(
        lab, tmp_path, ps_python, ps_code):
    # fleetrun-usage.rst: fleetrun --server_num=1 --worker_num=4 train.py
    # (--allow-concurrent: this machine is shared, other runs on it are not leftovers here;
    # no gloo: paddle's gloo finds no interface in the lab controller's namespace, which
    # has no default route, and crashes)
    result = fleetrun(lab, tmp_path, ps_python, ps_code, "--start_port", "17440",
                      "--allow-concurrent", "--server_num=1", "--worker_num=4",
                      "ps_train.py", "--steps", "10", "--no-gloo", gloo=False)
    assert result.returncode == 0, result.stderr[-3000:]
    done = re.findall(r"(?m)^127\.0\.0\.1 \[(\d)\]: trainer \d of 4 done: ", result.stdout)
    assert sorted(done) == ["0", "1", "2", "3"], result.stdout[-3000:]
    assert re.search(r"(?m)^127\.0\.0\.1 \[server 0\]: ", result.stdout)
