"""run --image end to end (issue 38): podman inside every lab host, an image only this
machine has (Debian's minbase with python3, built once by debootstrap and cached), 2
hosts x 2 ranks inside it; a rank killed, Ctrl-C and stop leave no container and no
rank on any host; check names a host without the engine and an image that differs,
with fixes that work when typed.
"""
from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import images
from conftest import running_lab
from test_faults import Controller, on_host, wait_for

IMAGE = "localhost/multihost-test:bookworm-python3"
TORCH_IMAGE = "localhost/multihost-test:bookworm-torch"
# Each rank says where it runs and whether in a container; rank 0 waits until every
# other rank reached it over TCP (the host network: the other host's address), then all
# sleep JOB_SLEEP seconds (a long job, for the stop tests).
RANK = textwrap.dedent("""\
    import os, socket, time
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    attempt = os.environ.get("MULTIHOST_RESTART_COUNT", "0")
    if os.environ.get("FAIL_FIRST") and attempt == "0" and rank == 3:
        raise SystemExit(3)
    inside = os.path.exists("/run/.containerenv") or os.path.exists("/.dockerenv")
    print("up rank=%d host=%s inside=%s uid=%d" % (rank, socket.gethostname(), inside,
                                                   os.getuid()), flush=True)
    if os.environ.get("WRITE_OUT"):   # a file in the code directory, for `fetch`
        os.makedirs("out", exist_ok=True)
        with open("out/rank%d.txt" % rank, "w") as out:
            out.write("rank %d on %s inside=%s\\n" % (rank, socket.gethostname(), inside))
    if rank == 0:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen(world)
        met = {0}
        while len(met) < world:
            conn, _ = server.accept()
            met.add(int(conn.recv(16).decode()))
            conn.close()
        print("all %d ranks met" % world, flush=True)
    else:
        for _ in range(600):
            try:
                conn = socket.create_connection((addr, port), timeout=2)
                conn.sendall(str(rank).encode())
                conn.close()
                break
            except OSError:
                time.sleep(0.1)
    time.sleep(float(os.environ.get("JOB_SLEEP") or 0))
""")


# PyTorch's DDP example, on random data: each rank its own batches (seeded by rank), the
# gradients averaged over gloo, so every rank ends with the same weights (a checksum).
DDP_JOB = textwrap.dedent("""\
    import os, socket
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    for step in range(20):
        x = torch.randn(16, 32, generator=data)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    inside = os.path.exists("/run/.containerenv") or os.path.exists("/.dockerenv")
    print("ddp rank=%d world=%d host=%s inside=%s torch=%s loss=%.4f checksum=%.9f" % (
        rank, world, socket.gethostname(), inside, torch.__version__, loss.item(), checksum),
        flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def clab():
    from multihost.lab import containers

    reason = containers.unavailable()
    if reason:
        pytest.skip(f"podman cannot run in lab hosts here: {reason}")
    tarball = images.base_rootfs()
    with running_lab(3, containers=True) as lab:   # the runs' 2 hosts, and a spare
        lab.env.update(containers.controller_env(lab.lab.paths))
        subprocess.run(["podman", "import", "-q", str(tarball), IMAGE], env=lab.env,
                       check=True, capture_output=True, timeout=300)
        yield lab


@pytest.fixture(scope="module")
def torch_image(clab):
    """A training image with torch (CPU), on this machine only."""
    tarball = images.torch_rootfs()
    subprocess.run(["podman", "import", "-q", str(tarball), TORCH_IMAGE], env=clab.env,
                   check=True, capture_output=True, timeout=900)
    yield TORCH_IMAGE
    subprocess.run(["podman", "rmi", "-f", TORCH_IMAGE], env=clab.env, capture_output=True)


@pytest.fixture
def code(tmp_path: Path) -> Path:
    directory = tmp_path / f"image-{secrets.token_hex(3)}"   # its own workdir on hosts
    directory.mkdir()
    (directory / "rank.py").write_text(RANK)
    return directory


def two(lab) -> str:
    """The runs' hosts: the lab's third is a spare."""
    return ",".join(lab.addresses[:2])


def run_args(lab, code: Path, *extra: str):
    return ["run", "--ips", two(lab), "--nproc_per_node", "2",
            "--launcher", "python", "--image", IMAGE, "--code", str(code), "--plain",
            "--log_dir", str(code.parent / "log"), "--kill-wait", "2", *extra, "--", "rank.py"]


def host_env(lab):
    """A host's own engine settings, not the controller's (containers.controller_env)."""
    return {k: v for k, v in lab.env.items() if not k.startswith("CONTAINERS_")}


def podman_on(lab, i: int, *argv: str) -> subprocess.CompletedProcess:
    return lab.host_run(i, ["podman", *argv], timeout=120, env=host_env(lab))


def image_id(lab, i: int) -> str:
    return podman_on(lab, i, "image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()


def containers_of(lab, run_id: str):
    """{host: [container names]} of the run, on every host that has one."""
    found = {}
    for i in (1, 2, 3):
        names = podman_on(lab, i, "ps", "-a", "--format", "{{.Names}}", "--filter",
                          f"label=multihost.run={run_id}").stdout.split()
        if names:
            found[i] = names
    return found


def ranks_of(lab, run_id: str):
    """{host: [pids]} of processes that carry the run's marker."""
    scan = ("import os,sys\nfor p in os.listdir('/proc'):\n if p.isdigit():\n  try:\n"
            "   e=open('/proc/%s/environ'%p,'rb').read()\n  except OSError:\n   continue\n"
            "  if b'MULTIHOST_RUN_ID='+sys.argv[1].encode() in e: print(p)\n")
    found = {}
    for i in (1, 2, 3):
        pids = lab.host_run(i, [sys.executable, "-c", scan, run_id]).stdout.split()
        if pids:
            found[i] = pids
    return found


def nothing_left(lab, run_id: str) -> None:
    assert containers_of(lab, run_id) == {}
    assert ranks_of(lab, run_id) == {}


def all_up(lab, run_id: str) -> None:
    wait_for(lambda: sum(len(v) for v in containers_of(lab, run_id).values()) == 4, 90,
             "the run's 4 containers never ran")


def test_ranks_run_inside_an_image_only_the_controller_has(clab, code):
    """No host has the image and none can pull it (no registry): multihost sends this
    machine's to both, and all 4 ranks meet over the hosts' network, as the ssh user."""
    for i in (1, 2):
        podman_on(clab, i, "rmi", "-f", IMAGE)
    result = clab.multihost(*run_args(clab, code), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sending " + IMAGE + " from this machine to 2 host(s)" in result.stderr
    assert "not reached through the relay" not in result.stderr, result.stderr[-3000:]
    for rank, host in ((0, "h1"), (1, "h1"), (2, "h2"), (3, "h2")):
        assert f"up rank={rank} host={host} inside=True uid=0" in result.stdout
    assert "all 4 ranks met" in result.stdout
    wanted = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", IMAGE],
                            env=clab.env, capture_output=True, text=True).stdout.strip()
    assert image_id(clab, 1) == image_id(clab, 2) == wanted
    run_id = result.stderr.split("multihost: run ", 1)[1].split(":", 1)[0]
    nothing_left(clab, run_id)


def test_a_rank_killed_inside_its_container_is_named_and_nothing_is_left(clab, code):
    controller = Controller(clab, run_args(clab, code, "--env", "JOB_SLEEP=300"), env=clab.env)
    try:
        run_id = controller.run_id(120)
        all_up(clab, run_id)
        wait_for(lambda: "all 4 ranks met" in controller.text("out"), 60, "ranks never met")
        # Rank 3's python, found and killed inside host 2 (its pid there, not here).
        kill = ("import os,signal,sys\nfor p in os.listdir('/proc'):\n if p.isdigit():\n"
                "  try:\n   e=open('/proc/%s/environ'%p,'rb').read()\n"
                "   c=open('/proc/%s/cmdline'%p,'rb').read()\n  except OSError:\n   continue\n"
                "  if b'RANK=3\\0' in e and c.startswith(b'python3') and sys.argv[1].encode() in e:\n"
                "   os.kill(int(p),signal.SIGKILL); print(p)\n")
        killed = clab.host_run(2, [sys.executable, "-c", kill, run_id])
        assert killed.stdout.strip(), f"rank 3 not found on host 2: {killed.stderr}"
        assert controller.wait(120) != 0
    finally:
        controller.kill()
    assert "rank 3" in controller.text("err") and "SIGKILL" in controller.text("err")
    nothing_left(clab, run_id)


@pytest.mark.parametrize("how", ["ctrl-c", "stop"])
def test_ctrl_c_and_stop_end_every_container(clab, code, how):
    extra = ("--env", "JOB_SLEEP=300") + (("--detach",) if how == "stop" else ())
    controller = Controller(clab, run_args(clab, code, *extra), env=clab.env)
    try:
        run_id = controller.run_id(120)
        all_up(clab, run_id)
        if how == "ctrl-c":
            os.killpg(controller.proc.pid, signal.SIGINT)
        else:
            assert controller.wait(60) == 0
            stopped = clab.multihost("stop", run_id, timeout=120)
            assert stopped.returncode == 0, stopped.stderr
        controller.wait(120)
    finally:
        controller.kill()
    nothing_left(clab, run_id)


def test_check_names_a_differing_image_and_a_host_without_the_engine(clab, code):
    """Host 2's tag names another image: check fails it and its fix (the image from this
    machine) makes the run go; a host without podman is named with the install line."""
    saved = subprocess.run(["podman", "save", IMAGE], env=clab.env, capture_output=True,
                           check=True).stdout
    loaded = clab.host_run(1, ["podman", "load"], input=saved, text=False, env=host_env(clab))
    assert loaded.returncode == 0, loaded.stderr
    other = clab.host_run(2, ["sh", "-c", f"tar -cf - -C /etc hostname | podman import - {IMAGE}"],
                          env=host_env(clab))
    assert other.returncode == 0, other.stderr
    check = clab.multihost("check", "--ips", two(clab), "--image", IMAGE,
                           "--plain", "-v", "--code", str(code), timeout=120)
    assert check.returncode == 3, check.stdout + check.stderr
    line = next(l for l in check.stdout.splitlines() if "198.18.0.12 [1] image: fail" in l)
    assert "the hosts would run different images" in line
    assert "add `--image-from-controller`" in check.stdout
    fixed = clab.multihost(*run_args(clab, code, "--image-from-controller"), timeout=300)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert image_id(clab, 1) == image_id(clab, 2)

    # podman hidden in host 1 alone (its own mount namespace), until the test ends.
    hidden = clab.host_run(1, ["mount", "--bind", "/dev/null", "/usr/bin/podman"],
                           env=host_env(clab))
    assert hidden.returncode == 0, hidden.stderr
    try:
        check = clab.multihost("check", "--ips", two(clab), "--image", IMAGE,
                               "--engine", "podman", "--plain", "-v", "--code", str(code),
                               timeout=120)
    finally:
        clab.host_run(1, ["umount", "/usr/bin/podman"])
    assert check.returncode == 3
    line = next(l for l in check.stdout.splitlines() if "198.18.0.11 [0] image: fail" in l)
    assert "podman is not installed on this host" in line
    assert f"--include 198.18.0.11 -- apt-get install -y podman catatonit" in check.stdout


def test_a_controller_lost_mid_launch_leaves_no_container(clab, code, tmp_path):
    """Node 0's containers run, node 1's launch is late, the controller dies between the
    two: past --launch-timeout node 0 gives up, and its containers go with its ranks."""
    slow = f"/root/slowpy-{secrets.token_hex(3)}"
    on_host(clab, 2, slow).write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in *run.launch*) sleep 8;; esac
        exec {sys.executable} "$@"
        """))
    on_host(clab, 2, slow).chmod(0o755)
    hostfile = tmp_path / "hosts.ini"
    hostfile.write_text(f"[{clab.address(1)}]\npython = {sys.executable}\n"
                        f"[{clab.address(2)}]\npython = {slow}\n")
    argv = run_args(clab, code, "--env", "JOB_SLEEP=300", "--launch-timeout", "5")
    argv[argv.index("--ips"):argv.index("--ips") + 2] = ["--hostfile", str(hostfile)]
    controller = Controller(clab, argv, env=clab.env)
    try:
        run_id = controller.run_id(120)
        wait_for(lambda: len(containers_of(clab, run_id).get(1, ())) == 2, 90,
                 "node 0's containers never ran")
        controller.kill()
        wait_for(lambda: not containers_of(clab, run_id) and not ranks_of(clab, run_id), 60,
                 "the run's containers were left on the hosts")
    finally:
        controller.kill()
        clab.host_run(2, ["rm", "-f", slow])


def test_check_names_a_container_left_by_an_earlier_run_and_its_fix_removes_it(clab, code):
    saved = subprocess.run(["podman", "save", IMAGE], env=clab.env, capture_output=True,
                           check=True).stdout
    assert clab.host_run(1, ["podman", "load"], input=saved, text=False,
                         env=host_env(clab)).returncode == 0
    left = podman_on(clab, 1, "run", "-d", "--name", "mh-20200101-000000-dead-n0",
                     "--label", "multihost.run=20200101-000000-dead",
                     "--label", "multihost.owner=root", "--ulimit", "nproc=4096:4096",
                     "--ulimit", "nofile=20000:20000", IMAGE, "sleep", "600")
    assert left.returncode == 0, left.stderr
    check = clab.multihost("check", "--ips", two(clab), "--image", IMAGE,
                           "--plain", "-v", "--code", str(code), timeout=120)
    line = next(l for l in check.stdout.splitlines() if "198.18.0.11 [0] image: warn" in l)
    assert "container mh-20200101-000000-dead-n0 of run 20200101-000000-dead (owner root" in line
    fix = re.search(r"run `(multihost exec [^`]+)`", line).group(1)
    assert "podman rm -f mh-20200101-000000-dead-n0" in fix
    typed = clab.multihost(*shlex.split(fix)[1:], timeout=120)
    assert typed.returncode == 0, typed.stderr
    assert podman_on(clab, 1, "ps", "-a", "-q").stdout.strip() == ""


def test_hosts_without_the_image_pull_it_from_a_registry(clab, code):
    """The pull path: the image in a registry on the controller's lab address (Debian's
    docker-registry), both hosts pull it at once, and run it."""
    from multihost.lab import containers

    registry_bin = shutil.which("docker-registry")
    if not registry_bin:
        pytest.skip("no registry to pull from: docker-registry is not installed (scripts/setup.sh)")
    remote = f"{containers.registry_address()}/multihost-test:pull"
    registry = clab.popen([registry_bin, "serve", str(containers.registry_config(clab.lab.paths))],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)
    try:
        ping = f"import urllib.request; urllib.request.urlopen('http://{remote.split('/')[0]}/v2/')"
        wait_for(lambda: clab.run([sys.executable, "-c", ping]).returncode == 0, 30,
                 "the registry never answered")
        assert clab.run(["podman", "tag", IMAGE, remote]).returncode == 0
        pushed = clab.run(["podman", "push", "--tls-verify=false", remote], timeout=300)
        assert pushed.returncode == 0, pushed.stderr
        for i in (1, 2):
            podman_on(clab, i, "rmi", "-f", remote)
        args = run_args(clab, code)
        args[args.index(IMAGE)] = remote
        result = clab.multihost(*args, timeout=300)
    finally:
        os.killpg(registry.pid, signal.SIGKILL)
        registry.wait(10)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"pulling {remote} on 2 host(s)" in result.stderr
    assert "from this machine" not in result.stderr
    assert result.stdout.count("inside=True") == 4
    wanted = clab.run(["podman", "image", "inspect", "--format", "{{.Id}}", remote]).stdout.strip()
    assert podman_on(clab, 1, "image", "inspect", "--format", "{{.Id}}", remote).stdout.strip() \
        == podman_on(clab, 2, "image", "inspect", "--format", "{{.Id}}", remote).stdout.strip() \
        == wanted


def test_stacks_reach_every_rank_inside_its_container(clab, code):
    """`multihost stacks` finds each rank's process on its host (the records hold the
    pid inside the container) and its stack hook answers: the frame the rank sleeps in."""
    controller = Controller(clab, run_args(clab, code, "--env", "JOB_SLEEP=300"), env=clab.env)
    try:
        run_id = controller.run_id(120)
        all_up(clab, run_id)
        wait_for(lambda: "all 4 ranks met" in controller.text("out"), 60, "ranks never met")
        stacks = clab.multihost("stacks", run_id, timeout=120)
        assert stacks.returncode == 0, stacks.stderr
        # One stack for all four (the same frame), each rank reached in its container.
        assert "ranks 0-3 (4 rank(s) on" in stacks.stdout, stacks.stdout
        assert "rank.py\", line" in stacks.stdout, stacks.stdout
        stopped = clab.multihost("stop", run_id, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        controller.wait(120)
    finally:
        controller.kill()
    nothing_left(clab, run_id)


def test_a_restart_runs_the_next_attempt_in_new_containers(clab, code):
    """--max-restarts: rank 3 fails in attempt 0; attempt 1 starts in containers of its
    own name (-a1) on the same hosts, and the run succeeds with nothing left."""
    result = clab.multihost(*run_args(clab, code, "--env", "FAIL_FIRST=1", "--max-restarts", "1"),
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all 4 ranks met" in result.stdout
    run_id = result.stderr.split("multihost: run ", 1)[1].split(":", 1)[0]
    nothing_left(clab, run_id)


def test_torch_ddp_in_an_image_only_the_controller_has(clab, torch_image, code):
    """2 hosts x 2 ranks of torch DDP over gloo (torchrun inside each host's container),
    in a training image neither host has nor can pull: multihost sends it, every rank
    trains, the gradients meet across hosts (the same weights on all 4), nothing left."""
    for i in (1, 2):
        podman_on(clab, i, "rmi", "-f", torch_image)
    (code / "train_ddp.py").write_text(DDP_JOB)
    args = run_args(clab, code, "--image-from-controller")
    args[args.index("python")] = "torchrun"
    args[args.index(IMAGE)] = torch_image
    args[-1] = "train_ddp.py"
    # Six torch processes start at once on hosts that share a few busy cores: a host may
    # answer nothing for longer than the default 15 s without being lost.
    result = clab.multihost(*args, timeout=1200, env=clab.env_with(MULTIHOST_LOST_AFTER="120"))
    if result.returncode != 0 and "multihost: run " in result.stderr:
        clab.multihost("stop", result.stderr.split("multihost: run ", 1)[1].split(":", 1)[0],
                       timeout=120)   # the next tests find the hosts free
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"sending {torch_image} from this machine to 2 host(s)" in result.stderr
    assert "not reached through the relay" not in result.stderr, result.stderr[-3000:]
    ranks = {int(m.group(1)): m.groupdict() for m in re.finditer(
        r"ddp rank=(\d) world=4 host=(?P<host>h\d) inside=(?P<inside>\w+) torch=\S+ "
        r"loss=\S+ checksum=(?P<checksum>\S+)", result.stdout)}
    assert sorted(ranks) == [0, 1, 2, 3], result.stdout[-3000:]
    assert [ranks[r]["host"] for r in range(4)] == ["h1", "h1", "h2", "h2"]
    assert all(ranks[r]["inside"] == "True" for r in range(4))
    assert len({ranks[r]["checksum"] for r in range(4)}) == 1, ranks
    wanted = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", torch_image],
                            env=clab.env, capture_output=True, text=True).stdout.strip()
    for i in (1, 2):
        assert podman_on(clab, i, "image", "inspect", "--format", "{{.Id}}",
                         torch_image).stdout.strip() == wanted
    run_id = result.stderr.split("multihost: run ", 1)[1].split(":", 1)[0]
    nothing_left(clab, run_id)


def test_fetch_brings_back_files_the_ranks_wrote_inside_their_containers(clab, code, tmp_path):
    """The code directory is mounted at its own path: what a rank writes there inside
    the image is on its host, and `fetch --all` brings every host's copy here."""
    result = clab.multihost(*run_args(clab, code, "--env", "WRITE_OUT=1"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = result.stderr.split("multihost: run ", 1)[1].split(":", 1)[0]
    got = tmp_path / "got"
    done = clab.multihost("fetch", "--all", run_id, "out", "--to", str(got), timeout=120)
    assert done.returncode == 0, done.stderr
    for host, ranks in ((1, (0, 1)), (2, (2, 3))):
        for rank in ranks:
            wrote = got / clab.address(host) / "out" / f"rank{rank}.txt"
            assert wrote.read_text() == f"rank {rank} on h{host} inside=True\n"
    nothing_left(clab, run_id)


def test_a_spare_takes_node_0_inside_the_image(clab, code, tmp_path):
    """Host 1 is cut before the run: the spare (host 3, without the image) takes node 0
    and the rendezvous, gets the image from this machine, and runs its ranks in it."""
    for i in (2, 3):
        podman_on(clab, i, "rmi", "-f", IMAGE)
    hosts = tmp_path / "hosts.ini"
    hosts.write_text(f"[{clab.address(1)}]\n[{clab.address(2)}]\n"
                     f"[{clab.address(3)}]\nspare = true\n")
    argv = run_args(clab, code, "--connect-timeout", "3")
    argv[argv.index("--ips"):argv.index("--ips") + 2] = ["--hostfile", str(hosts)]
    with clab.cut_link(1):
        result = clab.multihost(*argv, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "198.18.0.11 replaced by spare 198.18.0.13 (node 0)" in result.stderr + result.stdout
    assert "sending " + IMAGE + " from this machine to 2 host(s)" in result.stderr
    for rank, host in ((0, "h3"), (1, "h3"), (2, "h2"), (3, "h2")):
        assert f"up rank={rank} host={host} inside=True" in result.stdout, result.stdout
    assert "all 4 ranks met" in result.stdout
    run_id = result.stderr.split("multihost: run ", 1)[1].split(":", 1)[0]
    nothing_left(clab, run_id)
