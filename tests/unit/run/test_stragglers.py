"""Stragglers judged from recorded paces: who is marked, who is not, and where a user
sees it (the dashboard's rows, plain and JSON lines, the final summary, the record)."""
from __future__ import annotations

import ast
import dataclasses
import io
import json
from pathlib import Path

from rich.console import Console

from multihost.events import LogBlock, LogLine, NodeChanged, NodeState, RunFinished, RunStarted
from multihost.logs.metrics import parse_metrics
from multihost.run import records as runs
from multihost.run.control import RunStatus
from multihost.run.progress import ProgressWatch
from multihost.run.stragglers import Pace, describe, from_json
from multihost.views.board import BoardModel
from multihost.views.dashboard import render
from multihost.views.jsonl import JsonView
from multihost.views.plain import PlainView
from multihost.views.status_view import header_lines

REPO = Path(__file__).resolve().parents[3]
HOSTS = ("198.18.0.11", "198.18.0.12", "198.18.0.13")
T0 = 1_000_000.0


def recorded(pace: Pace, rates, seconds=60, every=1.0, speed=False, nproc=1, start=T0):
    """Each rank printing, every ``every`` s, its step (or its speed) at its own rate; a
    function instead of a rate gives the rank's step at each time."""
    t = 0.0
    while t <= seconds:
        for rank, rate in enumerate(rates):
            node = rank // nproc
            if speed:
                pace.note(rank, node, HOSTS[node], start + t, speed=rate)
            else:
                step = rate(t) if callable(rate) else rate * t
                pace.note(rank, node, HOSTS[node], start + t, step=int(step))
        t += every
    return start + seconds


def test_a_rank_slower_than_the_median_by_its_speed_is_the_only_one_marked():
    pace = Pace()
    now = recorded(pace, [100.0, 104.0, 62.0, 100.0], speed=True, nproc=2)
    (slow,) = pace.judge(now)
    assert (slow.rank, slow.host, slow.measure, slow.slower) == (2, "198.18.0.12", "speed", -38)
    assert not slow.whole_host       # rank 3, on the same host, is healthy
    assert describe([slow]) == "198.18.0.12 rank 2 at 0.62x the median speed"


def test_without_a_printed_speed_the_step_rate_is_computed_across_epochs():
    pace = Pace()
    t = 0.0
    while t <= 40:   # steps counted per epoch (0-49, then 0 again), as fleet examples do
        for rank, rate in enumerate((5.0, 5.0, 2.5)):
            pace.note(rank, rank, HOSTS[rank], T0 + t, step=int(rate * t) % 50)
        t += 1
    (slow,) = pace.judge(T0 + 40)
    assert (slow.rank, slow.measure) == (2, "step rate") and abs(slow.ratio - 0.5) < 0.03


def test_a_slow_start_up_stops_counting_once_it_leaves_the_window():
    pace = Pace()
    warming = lambda t: t if t < 30 else 30 + 10 * (t - 30)   # 1 step/s for 30 s, then 10
    assert [s.rank for s in pace.judge(recorded(pace, [10.0, 10.0, warming], seconds=40))] == [2]
    later = Pace()
    assert later.judge(recorded(later, [10.0, 10.0, warming], seconds=70)) == ()


def test_no_judgment_with_fewer_than_three_ranks_or_a_few_samples():
    two = Pace()
    assert two.judge(recorded(two, [10.0, 2.0], seconds=60)) is None
    few = Pace()
    assert few.judge(recorded(few, [10.0, 10.0, 2.0], seconds=3)) is None   # 4 samples each
    enough = Pace()
    assert [s.rank for s in enough.judge(recorded(enough, [10.0, 10.0, 2.0], seconds=5))] == [2]


def test_every_rank_printing_the_jobs_speed_makes_no_straggler():
    pace = Pace()
    assert pace.judge(recorded(pace, [480.0, 480.0, 480.0, 480.0], speed=True, nproc=2)) == ()


def test_a_speed_that_is_no_number_from_a_host_skews_nothing():
    pace = Pace()
    now = recorded(pace, [100.0, 100.0, 60.0, 100.0], speed=True, nproc=2)
    for t in range(10):   # two ranks claim infinite (and negative) speeds on top
        pace.note(0, 0, HOSTS[0], now - t, speed=float("1e999"))
        pace.note(1, 0, HOSTS[0], now - t, speed=-5.0)
    assert [(s.rank, s.slower) for s in pace.judge(now)] == [(2, -40)]


def test_a_host_whose_every_rank_is_slow_is_a_slow_host():
    pace = Pace()
    now = recorded(pace, [100.0, 100.0, 60.0, 60.0, 100.0, 100.0], speed=True, nproc=2)
    slow = pace.judge(now)
    assert [(s.rank, s.whole_host) for s in slow] == [(2, True), (3, True)]
    assert describe(slow) == "198.18.0.12 (ranks 2,3: the whole host) at 0.60x the median speed"


def test_the_example_trainers_lines_carry_its_step_and_speed():
    source = (REPO / "examples" / "train_ddp.py").read_text()
    (form,) = [n.value for n in ast.walk(ast.parse(source))
               if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and n.value.startswith("epoch:")]
    found = parse_metrics(form % (1, 40, 0.25, 0.05, 1280.0))
    assert (found.epoch, found.step, found.loss, found.speed) == (1, 40, 0.25, 1280.0)


# -- the listener in front of the views -------------------------------------------------
def followed(rates, seconds=40, by_rank=False, nproc=1, hosts=HOSTS):
    """A ProgressWatch fed LogBlocks of steps, its events going to every view."""
    board, out, err, jsonl = BoardModel(by_rank=by_rank), io.StringIO(), io.StringIO(), io.StringIO()
    plain, as_json = PlainView(out, err), JsonView(jsonl)
    saved = []

    def views(event):
        for view in (board.apply, plain, as_json):
            view(event)

    watch = ProgressWatch(views, save=saved.append)
    watch(RunStarted("20260101-000000-abcd", hosts, nproc, "train.py", T0))
    for node, host in enumerate(hosts):
        watch(NodeChanged(node, host, NodeState.RUNNING, time=T0))
    t = 0.0
    while t <= seconds:
        for rank, rate in enumerate(rates):
            node = rank // nproc
            text = f"heartbeat\nepoch: 0, step:{int(rate * t)}, loss: 0.5"
            watch(LogBlock(node, hosts[node], rank % nproc, rank, text, T0 + t))
        watch.tick(T0 + t)
        t += 0.5
    return watch, board, err, jsonl, saved


def test_the_straggler_is_said_once_in_plain_lines_json_and_the_final_summary():
    watch, board, err, jsonl, saved = followed([4.0, 4.0, 2.0])
    watch(RunFinished("20260101-000000-abcd", 0, None, T0 + 41))
    said = err.getvalue().splitlines()
    assert said.count("multihost: stragglers: 198.18.0.13 rank 2 at 0.50x the median step rate") == 2
    assert said[-1] == "multihost: stragglers: 198.18.0.13 rank 2 at 0.50x the median step rate"
    events = [json.loads(l) for l in jsonl.getvalue().splitlines()]
    marks = [e for e in events if e["event"] == "stragglers"]
    assert marks and marks[-1]["stragglers"][0]["rank"] == 2
    assert saved[-1] == [{"host": "198.18.0.13", "node_rank": 2, "rank": 2, "ratio": 0.5,
                          "measure": "step rate", "whole_host": True}]


def screen(model, width=200):
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=True)
    console.print(render(model.snapshot(), now=T0 + 41))
    return console.file.getvalue()


def test_the_dashboard_marks_the_stragglers_row_and_never_folds_it_away():
    many = tuple(f"198.18.0.{10 + i}" for i in range(1, 21))
    rates = [4.0] * 20
    rates[13] = 2.6
    _, board, *_ = followed(rates, hosts=many)
    text = screen(board)
    rows = [l for l in text.splitlines() if l.count("│") >= 8]
    assert len(rows) == 2, text          # 19 healthy hosts folded, the slow one alone
    (slow,) = [r for r in rows if "slow" in r]
    assert "198.18.0.24" in slow and "running slow -35%" in slow
    assert "stragglers: 198.18.0.24 rank 13 at 0.65x the median step rate" in text


def test_a_host_row_names_its_slow_rank_and_a_rank_row_is_marked_by_rank():
    watch, board, *_ = followed([4.0, 4.0, 2.0, 4.0, 4.0, 4.0], nproc=2)
    assert "rank 2 slow -50%" in screen(board)
    _, by_rank, *_ = followed([4.0, 4.0, 2.0, 4.0, 4.0, 4.0], nproc=2, by_rank=True)
    (row,) = [l for l in screen(by_rank).splitlines() if "slow" in l and "│" in l]
    assert row.split("│")[1].strip() == "2" and "slow -50%" in row


def test_the_record_and_status_keep_the_stragglers(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _, _, _, _, saved = followed([4.0, 4.0, 2.0])
    node = runs.NodeRecord(0, {"name": "h1"}, "h1", "h1", 1, 0)
    record = runs.RunRecord("20250101-120000-ab12", 1.0, (node,), ("t.py",), "python", "",
                            stragglers=tuple(saved[-1]))
    runs.save_run(record)
    again = runs.load_run("20250101-120000-ab12")
    assert from_json(again.stragglers)[0].rank == 2
    status = RunStatus(again, ())
    assert "  stragglers: 198.18.0.13 rank 2 at 0.50x the median step rate" in header_lines(status)
    assert status.to_json()["stragglers"][0]["ratio"] == 0.5
    assert dataclasses.replace(again, stragglers=()).stragglers == ()
