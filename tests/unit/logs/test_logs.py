"""The log follower against real files through the local transport and the real helper."""
import json
import sys
import threading
import time

import pytest

from multihost.events import LogBlock, NodeChanged, NodeState
from multihost.fanout import HostGroup
from multihost.hosts import Host
from multihost.logs.follow import LogFollower
from multihost.untrusted import clean_block, clean_line

RUN = "20260101-000000-abcd"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run_dir = tmp_path / "home" / ".multihost" / "runs" / RUN
    (run_dir / "log").mkdir(parents=True)
    return run_dir


def follow(tmp_path, follow=False, nproc=2, timeout=20):
    host = Host(name="127.0.0.1", python=sys.executable)
    events = []
    lock = threading.Lock()

    def listener(event):
        with lock:
            events.append(event)

    with HostGroup([host]) as cluster:
        follower = LogFollower(cluster, RUN, [(host, nproc)], tmp_path / "mirror", listener,
                               follow=follow).start()
        assert follower.drain(timeout)
        follower.stop()
    return events


def lines(events):
    return [(line.rank, line.text) for e in events if isinstance(e, LogBlock) for line in e.split()]


def test_every_line_once_with_its_rank_and_a_byte_exact_mirror(home, tmp_path):
    (home / "log" / "workerlog.0").write_bytes(b"a0\na1\n")
    (home / "log" / "workerlog.1").write_bytes(b"b0\n")
    (home / "launcher.log").write_bytes(b"launcher says hi\n")
    assert sorted(lines(follow(tmp_path))) == [(-1, "launcher says hi"), (0, "a0"), (0, "a1"),
                                               (1, "b0")]
    mirror = tmp_path / "mirror" / "127.0.0.1"
    assert (mirror / "log" / "workerlog.0").read_bytes() == b"a0\na1\n"


def test_a_second_pass_resumes_from_the_mirror_without_repeating(home, tmp_path):
    log = home / "log" / "workerlog.0"
    log.write_bytes(b"one\ntwo\n")
    follow(tmp_path)
    with open(log, "ab") as handle:
        handle.write(b"three\n")
    assert lines(follow(tmp_path)) == [(0, "three")]
    assert (tmp_path / "mirror" / "127.0.0.1" / "log" / "workerlog.0").read_bytes() == \
        b"one\ntwo\nthree\n"


def test_follow_streams_until_the_node_finishes(home, tmp_path):
    log = home / "log" / "workerlog.1"

    def writer():
        for i in range(50):
            with open(log, "ab") as handle:
                handle.write(b"line %d\n" % i)
            time.sleep(0.005)
        with open(log, "ab") as handle:
            handle.write(b"no newline at the end")
        (home / "node.json").write_text(json.dumps({"state": "failed", "exit_code": 3}))

    thread = threading.Thread(target=writer)
    thread.start()
    events = follow(tmp_path, follow=True)
    thread.join()
    got = lines(events)
    assert got == [(1, f"line {i}") for i in range(50)] + [(1, "no newline at the end")]
    finished = [e for e in events if isinstance(e, NodeChanged)]
    assert finished and finished[-1].state == NodeState.FAILED and finished[-1].exit_code == 3


def test_global_rank_counts_the_processes_of_earlier_nodes(home, tmp_path):
    from multihost.logs.mirror_layout import nodes_of

    nodes = nodes_of([(Host(name="a", rank=0), 4), (Host(name="b", rank=1), 2),
                      (Host(name="c", rank=2), 2)])
    assert [n.first_rank for n in nodes] == [0, 4, 6]


@pytest.mark.parametrize("raw, shown", [
    (b"plain", "plain"),
    (b"10%\r50%\r100%", "100%"),
    (b"\xff\xfebad utf8", "\ufffd\ufffdbad utf8"),
    (b"\x1b[31mred\x1b[0m", "red"),
    (b"bell\x07", "bell\ufffd"),
    (b"tab\tkept", "tab\tkept"),
])
def test_lines_are_shown_safely(raw, shown):
    assert clean_line(raw) == shown


def test_a_second_follower_shows_lines_but_leaves_the_mirror_to_the_first(home, tmp_path):
    """`logs --follow` beside a live `run`: both see every line, the mirror has each once."""
    log = home / "log" / "workerlog.0"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    (home / "node.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0}))
    host = Host(name="127.0.0.1", python=sys.executable)
    seen = [[], []]
    with HostGroup([host]) as cluster:
        followers = [LogFollower(cluster, RUN, [(host, 1)], tmp_path / "mirror",
                                 seen[i].append, follow=True) for i in range(2)]
        for follower in followers:
            follower.start()
        assert all(f.drain(20) for f in followers)
    for events in seen:
        assert [text for _, text in lines(events)] == [f"line {i}" for i in range(100)]
    assert (tmp_path / "mirror" / "127.0.0.1" / "log" / "workerlog.0").read_bytes() == log.read_bytes()


def test_a_block_is_split_fast_and_cleaned_only_where_needed():
    assert clean_block(b"a\nb\n") == "a\nb"
    assert clean_block(b"ok\n1%\r99%\n\x1b[1mbold\x1b[0m\n") == "ok\n99%\nbold"


def test_a_line_still_being_written_is_never_shown_cut_in_two(home, tmp_path):
    log = home / "log" / "workerlog.0"
    log.write_bytes(b"whole\nhalf of a li")
    (home / "node.json").write_text(json.dumps({"state": "running"}))
    assert lines(follow(tmp_path)) == [(0, "whole")]
    with open(log, "ab") as handle:
        handle.write(b"ne\n")
    (home / "node.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0}))
    assert lines(follow(tmp_path)) == [(0, "half of a line")]


def test_a_progress_bar_is_shown_as_it_moves_before_its_line_ends(home, tmp_path):
    """tqdm, Lightning and the HF Trainer redraw one line with \\r: each state is shown
    while the bar runs (no newline yet), and the line once, at its end, as its last state."""
    from multihost.events import LogProgress

    log = home / "log" / "workerlog.1"
    log.write_bytes(b"")
    seen = threading.Condition()
    states = []

    def listener(event):
        with seen:
            if isinstance(event, LogProgress):
                states.append(event)
            elif isinstance(event, LogBlock):
                states.append(event.text)
            seen.notify_all()

    host = Host(name="127.0.0.1", python=sys.executable)
    with HostGroup([host]) as cluster:
        follower = LogFollower(cluster, RUN, [(host, 2)], tmp_path / "mirror", listener,
                               follow=True).start()
        for step in range(1, 6):
            with open(log, "ab") as handle:
                handle.write(b"\rEpoch 0:  %d/5 [00:0%d<00:01, 7.12it/s, train_loss=0.%d]" % (step, step, step))
            with seen:  # the state is shown while the line has no end
                assert seen.wait_for(lambda: any(isinstance(e, LogProgress) and f" {step}/5" in e.text
                                                 for e in states), timeout=10)
        with open(log, "ab") as handle:
            handle.write(b"\n")
        (home / "node.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0}))
        assert follower.drain(20)
        follower.stop()
    moving = [e for e in states if isinstance(e, LogProgress)]
    assert [e.rank for e in moving] == [1] * 5 and moving[-1].text.endswith("train_loss=0.5]")
    assert [e for e in states if isinstance(e, str)] == [moving[-1].text]   # the line, once
    assert (tmp_path / "mirror" / "127.0.0.1" / "log" / "workerlog.1").read_bytes() == log.read_bytes()


def test_a_bar_that_never_ends_its_line_is_held_in_bounded_memory_at_its_latest_state():
    from multihost.logs.frames import LineJoiner
    from multihost.untrusted import MAX_LINE

    joiner = LineJoiner()
    for step in range(200_000):   # 7 MB of \\r updates, fed as a host's frames bring them
        assert joiner.feed(b"\r %d/200000 [00:01<00:02, 9.0it/s]" % step) == b""
        if step % 1000 == 999:
            assert joiner.progress_update().startswith(b" %d/200000" % step)
            assert joiner.progress_update() == b""   # unchanged: nothing new to show
    assert len(joiner.pending) < MAX_LINE + 200
    assert joiner.feed(b"\n") .endswith(b"\r 199999/200000 [00:01<00:02, 9.0it/s]\n")
