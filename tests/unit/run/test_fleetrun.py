"""`multihost fleetrun`: every command of PaddlePaddle's reference docs, with
`fleetrun` / `python -m paddle.distributed.launch` replaced by `multihost fleetrun` and
nothing else, goes through the CLI's parser into the job multihost runs."""
from __future__ import annotations

import shlex

import pytest

from multihost.cli import build_parser, main
from multihost.errors import ConfigError
from multihost.commands.fleetrun import run_args
from multihost.run.fleetrun import SERVER, TRAINER, build_layout, role_env

X, Y = "10.0.0.1", "10.0.0.2"          # the docs' xx.xx.xx.xx and yy.yy.yy.yy
GPUS8 = "0,1,2,3,4,5,6,7"
IPS4 = "10.127.6.17,10.127.5.142,10.127.45.13,10.127.44.151"   # PaddleDetection's ip_list


def job(line: str, environ=None):
    """The `multihost run` arguments of `multihost fleetrun ...` (as a shell splits it)."""
    args = build_parser("fleetrun").parse_args(["fleetrun", *shlex.split(line)])
    return run_args(args, environ or {})


# (the reference command's flags and script, what multihost runs: hosts, gpus, command)
COLLECTIVE = [
    # fleetrun-usage.rst
    ("--gpus=0 train.py", None, "0", ["train.py"]),
    ("train.py", None, None, ["train.py"]),
    ("--gpus=0,1,2,3 train.py", None, "0,1,2,3", ["train.py"]),
    (f'--ips="{X},{Y}" --gpus=0,1,2,3 train.py', f"{X},{Y}", "0,1,2,3", ["train.py"]),
    (f'--ips="{X},{Y}" train.py', f"{X},{Y}", None, ["train.py"]),
    # PaddleDetection, DistributedTraining_cn.md (fleetrun spells it --selected_gpu there)
    (f"--selected_gpu {GPUS8} tools/train.py -c configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml --eval",
     None, GPUS8, ["tools/train.py", "-c", "configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml", "--eval"]),
    (f"--ips={IPS4} --selected_gpu {GPUS8} tools/train.py -c configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml --eval",
     IPS4, GPUS8, ["tools/train.py", "-c", "configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml", "--eval"]),
    # PaddleDetection, multi-machine training (paddle 1.x flags)
    (f"--selected_gpus {GPUS8} tools/train_multi_machine.py -c configs/faster_rcnn_r50_fpn_1x.yml",
     None, GPUS8, ["tools/train_multi_machine.py", "-c", "configs/faster_rcnn_r50_fpn_1x.yml"]),
    (f"--use_paddlecloud --cluster_node_ips {X},{Y} --node_ip {X} tools/train_multi_machine.py "
     "-c configs/faster_rcnn_r50_fpn_1x.yml", f"{X},{Y}", None,
     ["tools/train_multi_machine.py", "-c", "configs/faster_rcnn_r50_fpn_1x.yml"]),
    # PaddleOCR
    (f'--log_dir=./log/ --gpus "{GPUS8}" tools/train.py -c configs/rec/rec_mv3_none_bilstm_ctc.yml',
     None, GPUS8, ["tools/train.py", "-c", "configs/rec/rec_mv3_none_bilstm_ctc.yml"]),
    (f'--log_dir=./log/ --ips="{X},{Y}" --gpus="{GPUS8}" tools/train.py -c '
     "configs/rec/rec_mv3_none_bilstm_ctc.yml", f"{X},{Y}", GPUS8,
     ["tools/train.py", "-c", "configs/rec/rec_mv3_none_bilstm_ctc.yml"]),
    # PaddleSeg
    (f'--log_dir=./log/ --gpus "{GPUS8}" train.py --config configs/pp_liteseg/m.yml '
     "--save_dir output/m --save_interval 1000 --num_workers 3 --do_eval --use_vdl", None, GPUS8,
     ["train.py", "--config", "configs/pp_liteseg/m.yml", "--save_dir", "output/m",
      "--save_interval", "1000", "--num_workers", "3", "--do_eval", "--use_vdl"]),
    (f'--log_dir=./log/ --ips={X},{Y} --gpus "{GPUS8}" train.py --config configs/pp_liteseg/m.yml '
     "--do_eval", f"{X},{Y}", GPUS8, ["train.py", "--config", "configs/pp_liteseg/m.yml", "--do_eval"]),
]


@pytest.mark.parametrize("line, ips, gpus, command", COLLECTIVE)
def test_every_collective_reference_command_runs_under_paddles_launcher(line, ips, gpus, command):
    run = job(line)
    assert (run.launcher, run.ips, run.gpus, run.command, run.ps) == \
        ("paddle", ips, gpus, command, None)


def test_the_log_dir_and_start_port_keep_their_meaning():
    run = job("--log_dir=./log/ --start_port 17000 --nproc_per_node 2 train.py")
    assert (run.log_dir, run.start_port, run.nproc_per_node) == ("./log/", "17000", "2")


def test_cuda_visible_devices_on_the_controller_is_fleetruns_default_for_gpus():
    # `export CUDA_VISIBLE_DEVICES=0,1,2,3; fleetrun train.py`
    assert job("train.py", {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}).gpus == "0,1,2,3"
    assert job("--gpus 0 train.py", {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}).gpus == "0"


def test_multihosts_own_options_work_too():
    run = job("--hostfile hosts.ini --python /opt/venv/bin/python --env A=1 --no-sync "
              "--workdir /srv/job --plain --gpus 0,1 train.py --lr 0.1")
    assert (run.hostfile, run.python, run.env, run.no_sync, run.workdir, run.command) == \
        ("hosts.ini", "/opt/venv/bin/python", ["A=1"], True, "/srv/job", ["train.py", "--lr", "0.1"])


def layout(line: str, start_port=17000):
    run = job(line)
    machines = run.ips.split(",") if run.ips else ["127.0.0.1"]
    return run, build_layout(run.ps, machines, start_port)


def roles(found):
    return [(r.role, r.index, r.address, r.port, r.log_name) for r in found.roles]


def test_servers_and_workers_lists_name_the_machines_in_order_of_first_appearance():
    workers = ",".join([X] * 4 + [Y] * 4)
    run, found = layout(f'--servers="{X}:6170,{Y}:6171" --workers="{workers}" train.py')
    assert run.launcher == "paddle_ps" and run.ips == f"{X},{Y}"
    assert found.machines == (X, Y)
    assert [r.endpoint for r in found.of(SERVER)] == [f"{X}:6170", f"{Y}:6171"]
    # trainers without a port take FLAGS_START_PORT and up on their machine; ids follow
    assert [(r.index, r.endpoint, r.log_name) for r in found.of(TRAINER)] == \
        [(i, f"{X if i < 4 else Y}:{17000 + i % 4}", f"workerlog.{i % 4}") for i in range(8)]
    assert found.http_port == 17000 + 4        # the first free port on the first server's machine


def test_workers_with_their_own_ports_keep_them():
    workers = ",".join(f"{X if i < 4 else Y}:{6172 + i}" for i in range(8))
    _, found = layout(f'--servers="{X}:6170,{Y}:6171" --workers="{workers}" train.py')
    assert [r.port for r in found.of(TRAINER)] == list(range(6172, 6180))
    _, found = layout(f'--servers="{X}:6170,{Y}:6171" --workers="{X}:6172,{Y}:6173" train.py')
    assert roles(found) == [(SERVER, 0, X, 6170, "serverlog.0"), (TRAINER, 0, X, 6172, "workerlog.0"),
                            (SERVER, 1, Y, 6171, "serverlog.0"), (TRAINER, 1, Y, 6173, "workerlog.0")]


@pytest.mark.parametrize("servers, workers", [(1, 4), (2, 4), (2, 2)])
def test_server_and_worker_counts_run_on_this_machine_alone(servers, workers):
    run, found = layout(f"--server_num={servers} --worker_num={workers} train.py")
    assert run.ips is None and found.machines == ("127.0.0.1",)
    assert [r.port for r in found.roles] == list(range(17000, 17000 + servers + workers))
    assert len(found.of(TRAINER)) == workers and found.http_port == 17000 + servers + workers


def test_counts_with_ips_are_per_machine_and_ids_follow_the_machines():
    _, found = layout(f"--ips={X},{Y} --server_num=1 --worker_num=2 --http_port 18000 train.py")
    assert roles(found) == [
        (SERVER, 0, X, 17000, "serverlog.0"), (TRAINER, 0, X, 17001, "workerlog.0"),
        (TRAINER, 1, X, 17002, "workerlog.1"), (SERVER, 1, Y, 17000, "serverlog.0"),
        (TRAINER, 2, Y, 17001, "workerlog.0"), (TRAINER, 3, Y, 17002, "workerlog.1")]
    assert found.http_port == 18000 and found.ports_per_machine() == 3


def test_each_role_gets_the_variables_paddles_launcher_gives_it():
    _, found = layout(f'--servers="{X}:6170,{Y}:6171" --workers="{X},{Y}" --http_port 6200 train.py')
    server, trainer = found.of(SERVER)[1], found.of(TRAINER)[1]
    env = role_env(found, server, "/run/gloo")
    assert env["TRAINING_ROLE"] == "PSERVER" and env["PADDLE_PORT"] == "6171"
    assert env["POD_IP"] == Y and "PADDLE_TRAINER_ID" not in env
    env = role_env(found, trainer, "/run/gloo")
    assert (env["TRAINING_ROLE"], env["PADDLE_TRAINER_ID"], env["POD_IP"]) == ("TRAINER", "1", Y)
    assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == f"{X}:6170,{Y}:6171"
    assert env["PADDLE_TRAINER_ENDPOINTS"] == f"{X}:17000,{Y}:17000"
    assert env["PADDLE_TRAINERS_NUM"] == "2" and env["PADDLE_GLOO_HTTP_ENDPOINT"] == f"{X}:6200"


@pytest.mark.parametrize("line, words", [
    ("--servers=10.0.0.1 --workers=10.0.0.1 train.py", "has no port"),
    ("--servers=10.0.0.1:6170 train.py", "--servers and --workers go together"),
    ("--server_num=1 train.py", "needs servers and trainers"),
    ("--server_num=2 --worker_num=2 --heter_worker_num=2 train.py", "heterogeneous"),
    ("--ips=10.0.0.1 --servers=10.0.0.1:6170 --workers=10.0.0.1 train.py", "name the machines"),
    ("--ips=10.0.0.1 --cluster_node_ips=10.0.0.2 train.py", "different values"),
    ("--servers=10.0.0.1:6170 --workers=10.0.0.1:6170 train.py", "given twice"),
])
def test_a_ps_command_that_cannot_run_is_one_line_naming_the_fix(line, words):
    with pytest.raises(ConfigError, match=words):
        run = job(line)
        build_layout(run.ps, run.ips.split(","), 17000)


def test_a_bad_count_is_refused_by_the_cli_in_one_line(capsys):
    assert main(["fleetrun", "--worker_num=zero", "train.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--worker_num 'zero' is not a number" in err[0]
