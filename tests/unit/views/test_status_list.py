"""`status --list` and a one-rank node, as a user reads them."""
from __future__ import annotations

import dataclasses
import io

from multihost.hosts import Host
from multihost.run import records as runs
from multihost.views.status_view import render_list, rows


def record(run_id, state, exit_code=None, started=None, ended=None, nproc=2):
    hosts = [Host(f"10.0.0.{i + 1}", rank=i) for i in range(2)]
    nodes = tuple(runs.NodeRecord(h.rank, runs.host_to_dict(h), h.label, h.name, nproc,
                                  nproc * h.rank) for h in hosts)
    return runs.RunRecord(run_id, 1_700_000_000.0, nodes, ("train.py",), "torchrun", "",
                          world_size=2 * nproc, state=state, exit_code=exit_code,
                          started=started, ended=ended)


def test_the_list_has_a_header_the_exit_code_and_how_long_each_run_took():
    out = io.StringIO()
    render_list([record("20250101-120000-ab12", "failed", 3, 1_700_000_000.0, 1_700_000_090.0),
                 record("20250101-110000-cd34", "succeeded", 0, 1_700_000_000.0,
                        1_700_003_900.0)], out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["run", "name", "started", "state", "exit", "took", "hosts",
                                "command"]
    assert lines[1].split()[4:8] == ["failed", "3", "90s", "2"]
    assert lines[2].split()[4:8] == ["succeeded", "0", "65m", "2"]


def test_a_named_run_shows_its_name_in_the_list():
    out = io.StringIO()
    named = dataclasses.replace(record("20250101-120000-ab12", "running"), name="bert-large")
    render_list([named], out)
    assert out.getvalue().splitlines()[1].split()[:2] == ["20250101-120000-ab12", "bert-large"]


def test_a_node_of_one_rank_shows_that_rank_not_a_range():
    from multihost.run.control import NodeStatus, RunStatus

    rec = record("20250101-120000-ab12", "running", nproc=1)
    status = RunStatus(rec, tuple(NodeStatus(i, rec.nodes[i].label, 1, i) for i in range(2)))
    assert [row[3] for row in rows(status, 0.0)] == ["0", "1"]
