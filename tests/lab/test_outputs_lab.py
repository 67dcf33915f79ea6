"""Outputs come back and logs are where Paddle users look: `multihost fetch` and
`log/latest/workerlog.<global rank>`, through real runs on 2 lab hosts x 2 ranks."""
import hashlib
import sys

import pytest

pytestmark = pytest.mark.lab

WRITER = """\
import os
rank, node = int(os.environ["RANK"]), os.environ["MULTIHOST_NODE_RANK"]
print("rank %d says hello" % rank, flush=True)
if int(os.environ["LOCAL_RANK"]) == 0:
    os.makedirs("out/sub", exist_ok=True)
    with open("out/ckpt.bin", "wb") as f:
        f.write(os.urandom(3 << 20) if node == "0" else b"node %s" % node.encode())
    with open("out/sub/note.txt", "w") as f:
        f.write("node %s\\n" % node)
"""


@pytest.fixture(scope="module")
def ran(lab, tmp_path_factory):
    code = tmp_path_factory.mktemp("outputs")
    (code / "writer.py").write_text(WRITER)
    done = lab.multihost("run", "--ips", ",".join(lab.addresses[:2]), "--python", sys.executable,
                         "--launcher", "python", "--nproc_per_node", "2", "--code", str(code),
                         "--no-check", "--plain", "--", "writer.py", cwd=code)
    assert done.returncode == 0, done.stderr
    return code


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_log_latest_has_each_rank_by_its_global_rank(ran):
    latest = ran / "log" / "latest"
    assert latest.is_symlink()
    for rank in range(4):
        assert f"rank {rank} says hello" in (latest / f"workerlog.{rank}").read_text()


def test_fetch_brings_rank_0s_checkpoint_back_by_content(lab, ran, tmp_path):
    on_host = lab.host_path(1, f"/root/multihost/{ran.name}/out/ckpt.bin")
    done = lab.multihost("fetch", "out/ckpt.bin", "--to", str(tmp_path), cwd=ran)
    assert done.returncode == 0, done.stderr
    assert digest(tmp_path / "out" / "ckpt.bin") == digest(on_host)
    # a copy cut half way is finished by the same command again
    with open(tmp_path / "out" / "ckpt.bin", "r+b") as cut:
        cut.truncate(1 << 20)
    again = lab.multihost("fetch", "out", "--to", str(tmp_path), cwd=ran)
    assert again.returncode == 0, again.stderr
    assert digest(tmp_path / "out" / "ckpt.bin") == digest(on_host)
    assert (tmp_path / "out" / "sub" / "note.txt").read_text() == "node 0\n"


def test_fetch_all_puts_each_hosts_copy_under_its_name(lab, ran, tmp_path):
    done = lab.multihost("fetch", "--all", "out/sub/note.txt", "--to", str(tmp_path), cwd=ran)
    assert done.returncode == 0, done.stderr
    for node in (0, 1):
        got = tmp_path / lab.address(node + 1) / "out" / "sub" / "note.txt"
        assert got.read_text() == f"node {node}\n"


def test_fetch_of_a_missing_path_names_the_host_and_a_fix(lab, ran, tmp_path):
    done = lab.multihost("fetch", "out/nope.bin", "--to", str(tmp_path), cwd=ran)
    assert done.returncode == 1
    line = done.stderr.strip()
    assert line.count("\n") == 0 and lab.address(1) in line and "out/nope.bin" in line
    assert "(fix: see what is there: `multihost ssh 0" in line
    outside = lab.multihost("fetch", "../../etc/passwd", cwd=ran)
    assert outside.returncode != 0 and "inside the run's workdir" in outside.stderr


def test_the_python_api_fetches_as_the_command_does(lab, ran, tmp_path):
    script = ("import multihost; got = multihost.Run.load(None).fetch('out/sub/note.txt', "
              f"to={str(tmp_path)!r}); print(got[0].ok, got[0].dest)")
    done = lab.run([sys.executable, "-c", script], cwd=ran)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "True"
    assert (tmp_path / "out" / "sub" / "note.txt").read_text() == "node 0\n"
