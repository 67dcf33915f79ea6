"""The environment of a run's processes: layers, pass-through, reserved names, env
files, and the masking of secrets in everything shown or recorded."""
from __future__ import annotations

import pytest

from multihost.run import launchers as launch
from multihost.run import env as run_env
from multihost.errors import ConfigError
from multihost.hosts import Host
from multihost.job import JobOptions
from multihost.run.plan import Prepared, build_plan, launch_request

CONTROLLER = {
    "NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "ens5", "CUDA_LAUNCH_BLOCKING": "1",
    "CUDA_VISIBLE_DEVICES": "0", "TORCH_SHOW_CPP_STACKTRACES": "1", "PYTHONPATH": "/src",
    "OMP_NUM_THREADS": "4", "FLAGS_eager_delete_tensor_gb": "0", "FLAGS_START_PORT": "12345",
    "HOME": "/home/me", "PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "abcd1234", "LANG": "C",
}


def request_for(environ=CONTROLLER, user_env=None, gpus=None, ifaces=(None, None), node=1):
    hosts = [Host("10.0.0.1", rank=0), Host("10.0.0.2", rank=1)]
    plan = build_plan("20250101-120000-ab12", hosts, JobOptions(gpus=gpus),
                      launch.load_template("torchrun"), ["train.py"], start_port=17000,
                      addresses=["10.0.0.1", "10.0.0.2"], ifaces=list(ifaces), environ=environ,
                      user_env=user_env or {})
    prepared = Prepared("/r", "/w", {"lo": "127.0.0.1", "eth1": "10.0.0.2", "eth0": "10.0.0.1"})
    return launch_request(plan, plan.nodes[node], prepared)


def test_passthrough_takes_the_listed_families_only():
    env = request_for()["env"]
    for name in ("NCCL_DEBUG", "CUDA_LAUNCH_BLOCKING", "TORCH_SHOW_CPP_STACKTRACES",
                 "PYTHONPATH", "OMP_NUM_THREADS", "FLAGS_eager_delete_tensor_gb"):
        assert env[name] == CONTROLLER[name]
    for name in ("HOME", "PATH", "AWS_SECRET_ACCESS_KEY", "LANG"):
        assert name not in env
    # The controller's own devices say nothing about a host's.
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_multihost_variables_are_identical_but_for_the_node_rank():
    env0, env1 = request_for(node=0)["env"], request_for(node=1)["env"]
    assert env0["FLAGS_START_PORT"] == env1["FLAGS_START_PORT"] == "17000"
    assert (env0["MULTIHOST_NODE_RANK"], env1["MULTIHOST_NODE_RANK"]) == ("0", "1")
    for name in ("MULTIHOST_RUN_ID", "MULTIHOST_NUM_NODES", "MULTIHOST_NODE_IPS"):
        assert env0[name] == env1[name]
    assert env1["MULTIHOST_NODE_IPS"] == "10.0.0.1,10.0.0.2"
    assert env1["PYTHONUNBUFFERED"] == "1"


def test_socket_interface_from_check_unless_the_user_set_it():
    env = request_for(environ={}, ifaces=(None, "bond0"))["env"]
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "bond0"
    # Without check: the interface that holds the host's address.
    env = request_for(environ={})["env"]
    assert env["NCCL_SOCKET_IFNAME"] == "eth1"
    # Set by the user (controller env, --env): theirs wins.
    env = request_for(environ={"GLOO_SOCKET_IFNAME": "ens5"},
                      user_env={"NCCL_SOCKET_IFNAME": "ib0"})["env"]
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("ens5", "ib0")


def test_a_rich_progress_bar_is_told_to_draw_into_the_log_unless_the_user_says_otherwise():
    env = request_for()["env"]
    assert (env["TTY_COMPATIBLE"], env["COLUMNS"]) == ("1", "200")
    env = request_for(user_env={"TTY_COMPATIBLE": "0", "COLUMNS": "100"})["env"]
    assert (env["TTY_COMPATIBLE"], env["COLUMNS"]) == ("0", "100")


def test_gpus_set_cuda_visible_devices_and_user_env_wins_over_passthrough():
    env = request_for(gpus=(2, 3), user_env={"NCCL_DEBUG": "WARN"})["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["NCCL_DEBUG"] == "WARN"


@pytest.mark.parametrize("name, fix", [
    ("FLAGS_START_PORT", "--start-port"), ("MULTIHOST_RUN_ID", "multihost sets it"),
    ("MULTIHOST_ANYTHING", "multihost sets it"), ("RANK", "per rank"),
    ("PADDLE_TRAINER_ENDPOINTS", "per rank"),
])
def test_reserved_names_cannot_be_set_by_hand(name, fix):
    with pytest.raises(ConfigError) as err:
        run_env.check_user_env([(name, "1")], "--env", gpus_given=False)
    assert name in str(err.value) and fix in err.value.fix


def test_cuda_visible_devices_with_gpus_is_a_conflict_without_it_allowed():
    with pytest.raises(ConfigError, match="both say which devices"):
        run_env.check_user_env([("CUDA_VISIBLE_DEVICES", "0")], "--env", gpus_given=True)
    assert run_env.check_user_env([("CUDA_VISIBLE_DEVICES", "1")], "--env", False) == \
        {"CUDA_VISIBLE_DEVICES": "1"}


def test_env_file_dotenv_style(tmp_path):
    path = tmp_path / "job.env"
    path.write_text("# comment\n\nexport WANDB_PROJECT=det\nNCCL_DEBUG = INFO\n"
                    "MSG=\"hello world\"\nQUOTED='$HOME stays'\nEMPTY=\n")
    assert run_env.parse_env_file(str(path)) == [
        ("WANDB_PROJECT", "det"), ("NCCL_DEBUG", "INFO"), ("MSG", "hello world"),
        ("QUOTED", "$HOME stays"), ("EMPTY", "")]
    path.write_text("OK=1\nnot an assignment\n")
    with pytest.raises(ConfigError, match=r"job.env:2: the line starting 'not' is not NAME=VALUE"):
        run_env.parse_env_file(str(path))
    with pytest.raises(ConfigError, match="cannot read env file"):
        run_env.parse_env_file(str(tmp_path / "none.env"))


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("WANDB_API_KEY", True), ("DB_PASSWORD", True), ("aws_secret", True),
    ("MY_PASSWD", True), ("GOOGLE_CREDENTIALS", True), ("NCCL_DEBUG", False), ("PATH", False),
    # names that were shown in clear before the rule was widened (issue 11)
    ("DB_PASS", True), ("PASSWD", True), ("CREDENTIAL", True), ("AUTH", True),
    ("BASIC_AUTH_HEADER", True), ("MYSQL_PWD", True), ("SSH_PRIVATE", True),
    ("SESSION_COOKIE", True), ("OMP_NUM_THREADS", False), ("WANDB_PROJECT", False),
])
def test_secret_looking_names(name, secret):
    assert run_env.is_secret(name) is secret


def test_masking_env_and_argv():
    env = {"HF_TOKEN": "hf_abcdef123", "NCCL_DEBUG": "INFO"}
    assert run_env.mask_env(env) == {"HF_TOKEN": "***", "NCCL_DEBUG": "INFO"}
    argv = ["train.py", "--api-key", "k-1", "--token=t-2", "WANDB_API_KEY=w-3",
            "--url=https://x/?t=hf_abcdef123", "--lr", "0.1", "--keyframes=3"]
    assert run_env.mask_argv(argv, env) == [
        "train.py", "--api-key", "***", "--token=***", "WANDB_API_KEY=***",
        "--url=https://x/?t=***", "--lr", "0.1", "--keyframes=***"]


def test_passwords_in_urls_are_masked_in_env_and_argv():
    env = {"DATABASE_URL": "postgres://app:pw-123@db:5432/x", "REPO": "https://ghp_tok@github.com/o/r",
           "HOME_PAGE": "https://example.org/a@b", "NCCL_DEBUG": "INFO"}
    assert run_env.mask_env(env) == {
        "DATABASE_URL": "postgres://app:***@db:5432/x", "REPO": "https://***@github.com/o/r",
        "HOME_PAGE": "https://example.org/a@b", "NCCL_DEBUG": "INFO"}
    argv = ["train.py", "--db", "mysql://root:hunter2@10.0.0.5/app", "--mirror=s3://K:S@bucket/p"]
    assert run_env.mask_argv(argv) == [
        "train.py", "--db", "mysql://root:***@10.0.0.5/app", "--mirror=s3://K:***@bucket/p"]


def test_env_flag_takes_a_bare_name_from_the_controller_environment():
    environ = {"HF_TOKEN": "hf_from_shell", "EMPTY": ""}
    assert run_env.parse_env_flag("HF_TOKEN", environ) == ("HF_TOKEN", "hf_from_shell")
    assert run_env.parse_env_flag("EMPTY", environ) == ("EMPTY", "")
    assert run_env.parse_env_flag("A=b=c", environ) == ("A", "b=c")
    with pytest.raises(ConfigError, match=r"--env WANDB_API_KEY: WANDB_API_KEY is not set in "
                                          r"this shell.*export WANDB_API_KEY="):
        run_env.parse_env_flag("WANDB_API_KEY", environ)
    with pytest.raises(ConfigError, match="is not NAME=VALUE"):
        run_env.parse_env_flag("A B", environ)


def test_launch_request_records_only_masked_values_for_display():
    request = request_for(user_env={"HF_TOKEN": "hf_secret_value"})
    assert request["env"]["HF_TOKEN"] == "hf_secret_value"      # the job needs it
    shown = repr(request["display"])
    assert "hf_secret_value" not in shown and "abcd1234" not in shown
    assert request["display"]["env"]["HF_TOKEN"] == "***"
