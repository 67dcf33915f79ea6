"""What a host sends is untrusted input: log frames that name paths or break the format,
records forged with terminal escapes, a rank printing without newlines, a full disk on
the controller while mirroring. Each is what a user would see, on this machine."""
import errno
import io
import json
import os
import sys
import threading

import pytest

from multihost.logs import follow as logs
from multihost.errors import BadReply
from multihost.events import LogBlock, Notice, RunFinished
from multihost.fanout import HostGroup
from multihost.hosts import Host
from multihost.logs.follow import LogFollower
from multihost.logs.mirror import read_mirror, LineFilter
from multihost.run.outcome import Failure, parse_status, to_event
from multihost.untrusted import MAX_LINE
from multihost.views.plain import PlainView

RUN = "20260101-000000-abcd"
HOST = Host(name="127.0.0.1", python=sys.executable)


class Answer:
    """A helper process whose stdout is what a hostile host chose to send."""

    def __init__(self, data: bytes):
        self.stdout = io.BytesIO(data)
        self.stdin = io.BytesIO()

    def set_timeout(self, seconds):
        pass

    def close(self):
        pass


def follow(mirror, listener, follow=False, timeout=30):
    with HostGroup([HOST]) as cluster:
        follower = LogFollower(cluster, RUN, [(HOST, 2)], mirror, listener,
                               follow=follow).start()
        assert follower.drain(timeout)
        follower.stop()
    return follower


def answer_with(monkeypatch, data: bytes):
    monkeypatch.setattr(logs.helper, "start", lambda transport, op, request: Answer(data))


def every_file(top):
    return sorted(str(p.relative_to(top)) for p in top.rglob("*") if p.is_file())


@pytest.mark.parametrize("name", [
    "../../../escaped", "/tmp/mh-hostile-absolute", "log/../../escaped", "log/workerlog.0/../x",
    ".lock", "log/.workerlog.0.times", "log/envlog.0", "launcher.log/x"])
def test_a_log_frame_naming_anything_but_a_rank_log_writes_nothing_and_names_the_host(
        monkeypatch, tmp_path, name):
    top = tmp_path / "controller"
    mirror = top / "runs" / RUN
    mirror.mkdir(parents=True)
    answer_with(monkeypatch, b"D launcher.log 0 3\nok\nD %s 0 6\nowned\n" % name.encode())
    blocks = []
    follower = follow(mirror, blocks.append, follow=True)
    error = follower.errors[0]
    assert isinstance(error, BadReply) and str(error).startswith("127.0.0.1: ")
    assert name in str(error) and "\n" not in str(error)
    assert every_file(top) == [f"runs/{RUN}/127.0.0.1/.launcher.log.times",
                               f"runs/{RUN}/127.0.0.1/.lock", f"runs/{RUN}/127.0.0.1/launcher.log"]
    assert not os.path.exists("/tmp/mh-hostile-absolute")
    assert [b.text for b in blocks if isinstance(b, LogBlock)] == ["ok"]


@pytest.mark.parametrize("frames", [
    b"D log/workerlog.0 zero 3\nabc", b"D log/workerlog.0 0\n", b"D log/workerlog.0 -1 3\nabc",
    b"D log/workerlog.0 0 99999999999\n", b"Z log/workerlog.0 0 5000 7\nnotzlib",
    b"S {not json\n", b"X what\n", b"D log/workerlog.0 0 3 extra\nabc",
    b"\xff\xfe\n", b"H " + b"x" * 10000 + b"\n"])
def test_a_malformed_frame_ends_the_stream_with_one_line_and_no_traceback(
        monkeypatch, tmp_path, frames):
    crashed = []
    monkeypatch.setattr(threading, "excepthook", crashed.append)
    answer_with(monkeypatch, frames)
    follower = follow(tmp_path / "mirror", lambda event: None, follow=True)
    assert not crashed
    error = follower.errors[0]
    assert isinstance(error, BadReply), error
    assert str(error).startswith("127.0.0.1: ") and "\n" not in str(error)
    assert not list((tmp_path / "mirror").rglob("workerlog.0"))


ESCAPES = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwned\x07\x1b[2J\x9b31m"


def test_a_forged_status_record_reaches_no_terminal_raw_and_breaks_nothing():
    reply = {"state": "failed" + ESCAPES, "detail": "x\ny" + ESCAPES, "procs": "many",
             "node": {"exit_code": "3; rm", "signal": [9], "started": "yesterday"},
             "ranks": [{"local_rank": 0, "exit_code": 3, "pid": "1"}, "junk", None],
             "tails": {"0": ["loss 0.1", ESCAPES + "Traceback", 7], "../x": ["?"]},
             "launcher_tail": "not a list"}
    view = parse_status(reply)
    assert view.exit_code is None and view.signal is None and view.started is None
    assert view.procs == 0 and view.ranks[0].exit_code == 3 and view.ranks[0].pid is None
    assert view.tails[0][:2] == ("loss 0.1", "Traceback") and set(view.tails) == {0}
    assert "\x1b" not in view.state + view.detail and "\n" not in view.detail
    failure = Failure(1.0, 1, "h2", "rank", 3, 1, 3, None, view.detail)
    out, err = io.StringIO(), io.StringIO()
    PlainView(out, err)(RunFinished(RUN, 3, to_event(failure, view.tails[0]), 2.0))
    said = err.getvalue()
    assert "Traceback" in said and "loss 0.1" in said
    assert not any(c in said for c in "\x1b\x07\x9b"), repr(said)


def test_a_progress_bar_without_newlines_is_held_in_bounded_memory_and_shown_at_its_end(
        monkeypatch, tmp_path):
    home = tmp_path / "home"
    run_dir = home / ".multihost" / "runs" / RUN
    (run_dir / "log").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    bar = b"".join(b"\rstep %07d/3000000 [%s]" % (i, b"#" * 40) for i in range(0, 3000000, 20))
    huge = b"x" * (3 * MAX_LINE) + b"END"
    (run_dir / "log" / "workerlog.0").write_bytes(bar + b"\rdone\n" + huge + b"\nafter\n")
    (run_dir / "node.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0}))
    held = []
    real_feed = logs.LineJoiner.feed

    def feed(joiner, data):
        done = real_feed(joiner, data)
        held.append(len(joiner.pending))
        return done

    monkeypatch.setattr(logs.LineJoiner, "feed", feed)
    blocks = []
    follow(tmp_path / "mirror", blocks.append)
    shown = [line for b in blocks if isinstance(b, LogBlock) for line in b.lines]
    assert shown[0] == "done" and shown[2] == "after" and len(shown) == 3
    assert shown[1].startswith("x" * 100) and "line cut at" in shown[1]
    assert len(shown[1]) < MAX_LINE + 200 and "END" not in shown[1]
    assert max(held) < MAX_LINE + 200  # the 7 MB bar never sat in memory whole
    mirrored = tmp_path / "mirror" / "127.0.0.1" / "log" / "workerlog.0"
    assert mirrored.read_bytes() == (run_dir / "log" / "workerlog.0").read_bytes()
    # `logs` reading the mirror shows the same lines, in the same bounded way
    node = logs.nodes_of([(HOST, 1)])
    again = [line for b in read_mirror(tmp_path / "mirror", node, LineFilter()) for line in b.lines]
    assert again == shown


def test_a_full_controller_disk_keeps_lines_showing_says_so_once_and_repairs_the_mirror(
        monkeypatch, tmp_path):
    home = tmp_path / "home"
    run_dir = home / ".multihost" / "runs" / RUN
    (run_dir / "log").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(logs, "RETRY_EVERY", 0.1)
    log = run_dir / "log" / "workerlog.0"
    full = threading.Event()
    full.set()
    real_opener = logs.private_opener

    def opener(path, flags):
        if full.is_set() and "workerlog" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_opener(path, flags)

    monkeypatch.setattr(logs, "private_opener", opener)
    events = []
    seen_lines = threading.Event()

    def listener(event):
        events.append(event)
        if isinstance(event, LogBlock) and "line 59" in event.text:
            seen_lines.set()

    def job():
        for i in range(120):
            with open(log, "ab") as out:
                out.write(b"line %d\n" % i)
            if i == 59:
                seen_lines.wait(20)  # the first half was shown while the disk was full
                full.clear()         # then space returns
        (run_dir / "node.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0}))

    writer = threading.Thread(target=job)
    writer.start()
    follow(tmp_path / "mirror", listener, follow=True, timeout=60)
    writer.join()
    shown = [line for e in events if isinstance(e, LogBlock) for line in e.lines]
    assert shown == [f"line {i}" for i in range(120)]  # every line, once, in order
    mirrored = tmp_path / "mirror" / "127.0.0.1" / "log" / "workerlog.0"
    assert mirrored.read_bytes() == log.read_bytes()
    notices = [e.text for e in events if isinstance(e, Notice)]
    assert len(notices) == 2, notices
    assert "behind" in notices[0] and "no space left" in notices[0]
    assert "caught up" in notices[1]


def test_check_facts_and_error_text_from_a_host_are_shown_without_escapes(monkeypatch):
    """Process listings and data reports arrive in the check's facts; error text in any
    failure. Raw tool output keeps its lines (it is parsed here), never its escapes."""
    from multihost.check import calls as check_calls
    from multihost.errors import RemoteError
    from multihost.transport.local import LocalTransport

    facts = {"leftovers": [{"pid": 7, "cmd": "python train.py" + ESCAPES}],
             "out": "GPU 0\nGPU 1" + ESCAPES, ESCAPES: "key"}
    monkeypatch.setattr(check_calls.helper, "call", lambda *a, **k: facts)
    got = check_calls.call(LocalTransport(HOST), "check.host", {}, 5)
    assert got["leftovers"][0] == {"pid": 7, "cmd": "python train.py"}
    assert got["out"].splitlines()[0] == "GPU 0" and "\x1b" not in json.dumps(got)
    error = RemoteError("disk full" + ESCAPES + "\nsecond line", host="h1", fix="x" + ESCAPES)
    assert not any(c in str(error) for c in "\x1b\x07\x9b\n"), repr(str(error))
    assert str(error).startswith("h1: disk full")
