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

from test_run import hostfile, leftovers, paddle_python, run_id_in  # noqa: F401 (fixture)

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
