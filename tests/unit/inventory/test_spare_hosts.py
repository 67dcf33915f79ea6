"""Spare hosts: read from --spares and the hostfile, kept out of the job's world, and the
pure replacement logic (which spare, which node rank, the rendezvous, the restart rule)."""
from __future__ import annotations

import textwrap

import pytest

from multihost.errors import ConfigError
from multihost.hosts import Host, HostOptions, load_hosts, load_inventory
from multihost.job import JobOptions
from multihost.run import launchers as launch
from multihost.run.plan import Prepared, build_plan, launch_request
from multihost.run.restarts import may_restart, restart_budget
from multihost.spares import Replacement, SpareState, parse_spares, replace_node, spare_pool


def hostfile(tmp_path, text):
    path = tmp_path / "hosts.ini"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_hostfile_spares_are_not_part_of_the_world(tmp_path):
    path = hostfile(tmp_path, """
        [h1]
        [h5]
        spare = true
        [h2]
        [h3]
        spare=1
        [h4]
        spare = false
    """)
    hosts, spares = load_inventory(None, path)
    assert [(h.name, h.rank) for h in hosts] == [("h1", 0), ("h2", 1), ("h4", 2)]
    assert [h.name for h in spares] == ["h5", "h3"]
    assert {h.rank for h in spares}.isdisjoint({h.rank for h in hosts})
    # every other command sees the job's hosts only
    assert [h.name for h in load_hosts(None, path)] == ["h1", "h2", "h4"]


def test_spares_flag_takes_a_list_or_a_node_set_after_the_hostfile_spares(tmp_path):
    path = hostfile(tmp_path, "[h1]\n[h2]\n[h9]\nspare = yes\n")
    hosts, spares = load_inventory(None, path, HostOptions(python="python3.11"),
                                   parse_spares("gpu[5-6],bob@h7:2222"))
    assert [h.name for h in hosts] == ["h1", "h2"]
    assert [h.label for h in spares] == ["h9", "gpu5", "gpu6", "h7:2222"]
    assert spares[3].user == "bob" and spares[0].python == "python3.11"  # flags apply too


@pytest.mark.parametrize("text, words", [
    ("[h1]\nspare = maybe\n", ["hosts.ini:2", "spare 'maybe' is not true or false",
                               "spare = true"]),
    ("[defaults]\nspare = true\n[h1]\n", ["hosts.ini:2", "spare is set per host"]),
    ("[h1]\nspare = true\n", ["every host is a spare"]),
])
def test_bad_spare_lines_are_refused_in_one_line_naming_the_line(tmp_path, text, words):
    with pytest.raises(ConfigError) as info:
        load_inventory(None, hostfile(tmp_path, text))
    line = info.value.one_line() if hasattr(info.value, "one_line") else str(info.value)
    assert "\n" not in line
    for word in words:
        assert word in line


@pytest.mark.parametrize("text, words", [
    ("", ["--spares is empty"]),
    ("h5,,h6", ["empty name"]),
    ("h5 h6", ["--spares item 1", "white space"]),
    ("h[3-1]", ["backwards"]),
])
def test_bad_spares_flags_are_refused(text, words):
    with pytest.raises(ConfigError) as info:
        parse_spares(text)
    for word in words:
        assert word in str(info.value)


def test_a_spare_listed_as_a_host_too_is_refused():
    with pytest.raises(ConfigError) as info:
        load_inventory("h1,h2", None, spares=parse_spares("h2"))
    assert "listed twice" in str(info.value) and "--spares item 1" in str(info.value)


def hosts3():
    return (Host("h1", rank=0, gpus=(0, 1)), Host("h2", rank=1, gpus=(0, 1)),
            Host("h3", rank=2, gpus=(0, 1)))


def test_a_spare_takes_the_node_rank_and_devices_of_the_host_it_replaces():
    after = replace_node(hosts3(), 2, Host("h5", rank=7))
    assert [(h.name, h.rank) for h in after] == [("h1", 0), ("h2", 1), ("h5", 2)]
    assert after[2].gpus == (0, 1)                       # so the world keeps its shape
    own = replace_node(hosts3(), 1, Host("h6", rank=8, gpus=(2, 3)))
    assert own[1].gpus == (2, 3)                          # its own when it says so


def test_the_next_spare_in_order_and_the_story_in_one_line():
    state = SpareState((Host("h5", rank=3), Host("h6", rank=4)))
    hosts, state = state.replace(hosts3(), 2, 1, "lost")
    assert [h.name for h in hosts] == ["h1", "h2", "h5"]
    assert [h.name for h in state.pool] == ["h6"]
    assert state.replacements[-1].line == "h3 replaced by spare h5 (node 2)"
    hosts, state = state.replace(hosts, 0, 1, "check")
    assert [h.name for h in hosts] == ["h6", "h2", "h5"]
    assert state.replace(hosts, 1, 1, "lost") is None     # none left


def test_a_spare_that_fails_in_turn_gives_its_place_to_the_next():
    state = SpareState((Host("h5", rank=3), Host("h6", rank=4)))
    hosts, state = state.replace(hosts3(), 1, 0, "check")
    hosts, state = state.replace(hosts, 1, 0, "check")    # h5 failed its check too
    assert [h.name for h in hosts] == ["h1", "h6", "h3"]
    assert [r.line for r in state.replacements] == ["h2 replaced by spare h6 (node 1)"]


def test_dead_spares_are_dropped_and_job_hosts_are_never_spares():
    pool = spare_pool(hosts3(), [Host("h3", rank=5), Host("h5", rank=6), Host("h5", rank=7)])
    assert [h.name for h in pool] == ["h5"]
    state = SpareState((Host("h5", rank=3), Host("h6", rank=4))).drop(["h5"])
    assert [h.name for h in state.pool] == ["h6"]


def test_a_replacement_survives_the_record():
    change = Replacement(1, 2, "h3", "h5", "lost")
    assert Replacement.from_json(change.to_json()) == change


def test_a_spare_on_node_0_moves_the_rendezvous():
    hosts = replace_node(hosts3(), 0, Host("198.18.0.15", rank=9))
    plan = build_plan("20250101-120000-ab12", hosts, JobOptions(),
                      launch.load_template("torchrun"), ["train.py"], start_port=17000,
                      addresses=["198.18.0.15", "198.18.0.12", "198.18.0.13"])
    assert plan.master_addr == "198.18.0.15" and plan.nodes[0].host.name == "198.18.0.15"
    request = launch_request(plan, plan.nodes[2], Prepared("/r", "/w", {}))
    assert "198.18.0.15" in " ".join(request["argv"])     # torchrun's --master_addr
    assert request["env"]["MULTIHOST_NODE_IPS"].startswith("198.18.0.15,")


def test_spares_imply_one_restart_each_and_only_for_a_lost_host():
    assert restart_budget(None, 2) == 2 and restart_budget(0, 2) == 0 and restart_budget(3, 1) == 3
    assert may_restart(None, 0, lost=True, spares_left=1)
    assert not may_restart(None, 0, lost=False, spares_left=1)   # a rank's own failure
    assert not may_restart(None, 1, lost=True, spares_left=0)    # none left
    assert not may_restart(0, 0, lost=True, spares_left=1)       # --max-restarts 0 said so
    assert may_restart(2, 1, lost=False, spares_left=0)          # restarts left: any failure


def test_status_and_the_plain_view_say_which_spare_took_which_node():
    import io
    from types import SimpleNamespace

    from multihost.events import RunStarted
    from multihost.run.records import NodeRecord, RunRecord
    from multihost.views.plain import PlainView
    from multihost.views.status_view import header_lines

    change = Replacement(1, 2, "h3", "h5", "lost")
    nodes = tuple(NodeRecord(i, {"name": n}, n, n, 1, i) for i, n in enumerate(["h1", "h2", "h5"]))
    record = RunRecord("20250101-120000-ab12", 0.0, nodes, ("t.py",), "python", "",
                       attempt=1, max_restarts=1, replacements=(change.to_json(),))
    lines = header_lines(SimpleNamespace(record=record))
    assert "  h3 replaced by spare h5 (node 2), from attempt 2 of 2" in lines
    out, err = io.StringIO(), io.StringIO()
    PlainView(out, err)(RunStarted("20250101-120000-ab12", ("h1", "h2", "h5"), 1, "t.py", 0.0,
                                   "attempt 2 of 2", (change.line,)))
    assert "h3 replaced by spare h5 (node 2)" in out.getvalue() + err.getvalue()


def test_a_job_file_names_spares_and_the_resolved_job_keeps_them(tmp_path):
    from multihost.cli import build_parser
    from multihost.commands.jobargs import defaults, with_job_file
    from multihost.run import jobfile

    job = tmp_path / "job.toml"
    job.write_text('hosts = ["h1", "h2"]\nspares = ["h5", "h6"]\ncommand = ["train.py"]\n')
    args = with_job_file(build_parser("run").parse_args(["run", "-f", str(job)]))
    assert args.spares == "h5,h6" and args.max_restarts is None
    assert jobfile.resolved(vars(args), defaults(args), ["train.py"])["spares"] == "h5,h6"


def test_stop_knows_the_hosts_spares_replaced_after_they_were_lost():
    from multihost.run.control import replaced_hosts
    from multihost.run.records import NodeRecord, RunRecord

    nodes = tuple(NodeRecord(i, {"name": n}, n, n, 1, i) for i, n in enumerate(["h1", "h5"]))
    earlier = {"host_fields": [{"name": "h1"}, {"name": "h2", "port": 2222}]}
    record = RunRecord("20250101-120000-ab12", 0.0, nodes, ("t.py",), "python", "",
                       attempt=1, max_restarts=1, attempts=(earlier,),
                       replacements=(Replacement(1, 1, "h2:2222", "h5", "lost").to_json(),
                                     Replacement(0, 0, "h0", "h1", "check").to_json()))
    assert [h.label for h in replaced_hosts(record)] == ["h2:2222"]   # not one that failed the check


def test_a_spare_that_would_change_the_world_size_is_refused():
    from multihost.run.lifecycle import same_shape

    job = JobOptions()
    after = replace_node(hosts3(), 1, Host("h6", rank=8, gpus=(0,)))
    with pytest.raises(ConfigError) as info:
        same_shape(job, hosts3(), after)
    assert "spare h6 would run 1 process(es) where node 1 ran 2" in str(info.value)
    same_shape(job, hosts3(), replace_node(hosts3(), 1, Host("h7", rank=9)))  # inherits: fine
