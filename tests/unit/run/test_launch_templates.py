"""Launcher templates: parsing, the checks done before anything starts, and rendering to
an argv (never a shell line) for each built-in launcher."""
from __future__ import annotations

from pathlib import Path

import pytest

from multihost.run import launchers as launch
from multihost.errors import ConfigError
from multihost.hosts import Host
from multihost.job import JobOptions
from multihost.run.plan import Prepared, build_plan, launch_request, template_values

RUN_DIR = "/home/u/.multihost/runs/20250101-120000-ab12"
TEMPLATES = Path(__file__).resolve().parents[3] / "templates"   # what users copy from


def plan_for(template, command=("train.py", "-c", "cfg.yml"), hosts=3, job=None, **kw):
    host_list = [Host(f"10.0.0.{i + 1}", rank=i, python="/opt/py/bin/python") for i in range(hosts)]
    return build_plan("20250101-120000-ab12", host_list, job or JobOptions(nproc_per_node=2),
                      template, list(command), start_port=17000,
                      addresses=[h.name for h in host_list], **kw)


def prepared(workdir="/home/u/work"):
    return Prepared(RUN_DIR, workdir, {"lo": "127.0.0.1", "eth0": "10.0.0.2"})


def test_torchrun_renders_ranks_in_node_order_with_master_on_the_first_host():
    plan = plan_for(launch.load_template("torchrun"))
    argv = launch_request(plan, plan.nodes[1], prepared())["argv"]
    assert argv == [
        "/opt/py/bin/python", "-m", "torch.distributed.run", "--nnodes=3", "--node_rank=1",
        "--nproc_per_node=2", "--master_addr=10.0.0.1", "--master_port=17000", "--no-python",
        "/opt/py/bin/python", "-S", f"{RUN_DIR}/rankwrap.py", RUN_DIR,
        "/opt/py/bin/python", "train.py", "-c", "cfg.yml"]


def test_arguments_are_passed_verbatim_never_reparsed():
    nasty = ["train.py", "--name", "a b; rm -rf ~", "$HOME", "'quoted'", "--x={y}"]
    plan = plan_for(launch.load_template("torchrun"), command=nasty)
    argv = launch_request(plan, plan.nodes[0], prepared())["argv"]
    assert argv[-len(nasty):] == nasty


def test_no_python_runs_the_command_as_given():
    plan = plan_for(launch.load_template("torchrun"), command=["./run.sh", "x"], no_python=True)
    argv = launch_request(plan, plan.nodes[0], prepared())["argv"]
    assert argv[-2:] == ["./run.sh", "x"] and argv[-3] == RUN_DIR


def test_paddle_gets_literal_ips_its_own_host_and_both_start_ports():
    plan = plan_for(launch.load_template("paddle"))
    request = launch_request(plan, plan.nodes[2], prepared())
    assert request["argv"] == [
        "/opt/py/bin/python", "-m", "paddle.distributed.launch",
        "--ips=10.0.0.1,10.0.0.2,10.0.0.3", "--host=10.0.0.3", "--start_port=17000",
        "--nproc_per_node=2", f"--log_dir={RUN_DIR}/log",
        # paddle runs a "script" not ending in .py as given: the rank wrapper, then python
        "/opt/py/bin/python", "-S", f"{RUN_DIR}/rankwrap.py", RUN_DIR,
        "/opt/py/bin/python", "train.py", "-c", "cfg.yml"]
    assert request["env"]["FLAGS_START_PORT"] == "17000"
    assert "CUDA_VISIBLE_DEVICES" not in request["env"]      # CPU: paddle must not see it


def test_paddle_passes_gpus_only_when_there_are_gpus():
    plan = plan_for(launch.load_template("paddle"), job=JobOptions(gpus=(0, 1, 2, 3)))
    request = launch_request(plan, plan.nodes[0], prepared())
    assert "--gpus=0,1,2,3" in request["argv"] and "--nproc_per_node=4" in request["argv"]
    assert request["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_paddle_refuses_no_python():
    with pytest.raises(ConfigError, match="always runs a python script"):
        plan_for(launch.load_template("paddle"), no_python=True)


def test_python_template_spawns_per_rank_with_global_rank_offsets():
    plan = plan_for(launch.load_template("python"), job=JobOptions(nproc_per_node=4))
    request = launch_request(plan, plan.nodes[2], prepared())
    assert request["spawn"] == "rank"
    assert request["argv"] == ["/opt/py/bin/python", "train.py", "-c", "cfg.yml"]
    assert (request["rank_offset"], request["world_size"], request["nproc"]) == (8, 12, 4)
    assert request["master_addr"] == "10.0.0.1" and request["master_port"] == 17000


def test_unknown_variable_is_an_error_naming_file_and_line():
    with pytest.raises(ConfigError) as err:
        launch.parse_template("# mine\n{python} -m x\n  --port={strat_port}\n", "my.tmpl")
    assert "my.tmpl:3: unknown variable {strat_port}" in str(err.value)
    assert "start_port" in err.value.fix


@pytest.mark.parametrize("text, message", [
    ("{python} x{program...}", "must stand alone"),
    ("{python} {program}", "must stand alone"),
    ("{python...} x", "one value, not a list"),
    ("{python} {", "stray brace"),
    ("@spawn sometimes\n{python}", "not node or rank"),
    ("@bogus\n{python}", "unknown directive"),
    ("@env 1BAD=x\n{python}", "not NAME=value"),
    ("# nothing\n", "no command"),
    ("@spawn rank\n{rank_log...} {program...}", "for @spawn node"),
    ("{python} 'unclosed", "close the quote"),
])
def test_template_mistakes_are_config_errors(text, message):
    with pytest.raises(ConfigError, match=message):
        launch.parse_template(text, "t.tmpl")


def test_optional_words_escapes_comments_and_env_directives():
    template = launch.parse_template(
        "@env LAUNCHER_PORT={start_port}\n"
        "{python} run.py [--gpus={gpus}] [--host={host_ip}] '{{literal}}'  # a comment\n"
        "  {script_args...}\n", "t.tmpl")
    values = {name: "" for name in launch.VARIABLES}
    values.update(python="py", gpus="", host_ip="10.0.0.2", start_port="9000",
                  script_args=["a", "b"])
    assert launch.render(template, values) == ["py", "run.py", "--host=10.0.0.2", "{literal}",
                                               "a", "b"]
    assert launch.render_env(template, values) == {"LAUNCHER_PORT": "9000"}


def test_user_template_file_and_unreadable_one(tmp_path):
    path = tmp_path / "deepspeed.tmpl"
    path.write_text("deepspeed --num_gpus={nproc_per_node} {script} {script_args...}\n")
    template = launch.load_template(str(path))
    assert template.spawn == "node" and not template.builtin
    assert template.variables() == ("nproc_per_node", "script", "script_args")
    with pytest.raises(ConfigError, match="cannot read launcher template"):
        launch.load_template(str(tmp_path / "missing.tmpl"))


def test_every_builtin_template_loads_and_uses_only_known_variables():
    for name in launch.BUILTIN:
        template = launch.load_template(name)
        assert set(template.variables()) <= set(launch.VARIABLES) | set(launch.LIST_VARIABLES)


def test_a_builtin_copied_from_the_templates_folder_is_the_same_launcher():
    for name in launch.BUILTIN:
        copied = launch.load_template(str(TEMPLATES / f"{name}.tmpl"))
        builtin = launch.load_template(name)
        assert (copied.spawn, copied.words, copied.env) == (builtin.spawn, builtin.words, builtin.env)


def test_the_user_example_renders_one_accelerate_launch_per_host():
    plan = plan_for(launch.load_template(str(TEMPLATES / "accelerate.tmpl")),
                    job=JobOptions(nproc_per_node=4))
    request = launch_request(plan, plan.nodes[2], prepared())
    assert request["argv"] == [
        "/opt/py/bin/python", "-m", "accelerate.commands.accelerate_cli", "launch", "--multi_gpu",
        "--num_machines=3", "--machine_rank=2", "--num_processes=12",
        "--main_process_ip=10.0.0.1", "--main_process_port=17000", "--no_python",
        "/opt/py/bin/python", "-S", f"{RUN_DIR}/rankwrap.py", RUN_DIR,
        "/opt/py/bin/python", "train.py", "-c", "cfg.yml"]
    assert request["env"]["ACCELERATE_LOG_LEVEL"] == "info"


def test_template_values_cover_every_documented_variable():
    plan = plan_for(launch.load_template("torchrun"))
    values = template_values(plan, plan.nodes[0], prepared())
    assert set(values) == set(launch.VARIABLES) | set(launch.LIST_VARIABLES)


def test_display_folds_the_rank_wrapper():
    plan = plan_for(launch.load_template("torchrun"), command=["train.py", "a b"])
    shown = launch_request(plan, plan.nodes[0], prepared())["display"]["command"]
    assert "<rank-log> /opt/py/bin/python train.py 'a b'" in shown
    assert "rankwrap" not in shown


def test_no_script_is_an_error():
    with pytest.raises(ConfigError, match="no script given"):
        plan_for(launch.load_template("torchrun"), command=[])
