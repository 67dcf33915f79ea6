"""Grouping rank stacks (stacks.py): identical stacks once, the odd rank out last."""
from __future__ import annotations

from multihost.run.stacks import RankStack, group_stacks, rank_list, render

WAITING = ('Thread 0x00007f01 (most recent call first):\n'
           '  File "t.py", line 9 in wait_for_peers\n')
STUCK = 'Current thread 0x00007f02 (most recent call first):\n  File "t.py", line 6 in stuck\n'


def test_identical_stacks_are_grouped_whatever_their_thread_ids():
    samples = [RankStack(0, "h1", 0, "faulthandler", WAITING),
               RankStack(1, "h2", 0, "faulthandler", STUCK),
               RankStack(2, "h3", 0, "faulthandler", WAITING.replace("7f01", "7abc")),
               RankStack(3, "h3", 1, None, None, "not running")]
    groups = group_stacks(samples)
    assert [g.ranks for g in groups] == [(0, 2), (1,), (3,)]
    assert groups[0].hosts == ("h1", "h3") and "stuck" in groups[1].stack
    assert "(no stack) not running" == groups[2].stack


def test_a_stack_reaches_the_terminal_without_escape_codes():
    text = render(group_stacks([RankStack(0, "h1", 0, "py-spy", "File \x1b[2Jx.py\n")]))
    assert "\x1b" not in text and text.startswith("ranks 0 (1 rank(s) on h1):")
    assert rank_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_stacks_of_an_ended_run_says_it_ended_and_exits_1(tmp_path, monkeypatch, capsys):
    from multihost.cli import dispatch
    from multihost.hosts import Host
    from multihost.run import records as runs

    monkeypatch.setenv("HOME", str(tmp_path))
    host = Host("198.18.0.11")
    node = runs.NodeRecord(0, runs.host_to_dict(host), host.label, host.name, 2, 0,
                           state="succeeded")
    runs.save_run(runs.RunRecord("20250101-120000-ab12", 1.0, (node,), ("train.py",),
                                 "torchrun", "", start_port=17000, world_size=2,
                                 state="succeeded", exit_code=0), make_last=True)
    assert dispatch(["stacks"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("multihost: run 20250101-120000-ab12 has ended (succeeded); stacks "
                          "are only for a running run (fix: see how it ended: multihost status")
    assert "(no stack)" not in err
