"""A rank whose wrapper was killed (SIGKILL: it catches every other signal) leaves a
record without an end: it is read as killed just before the peers its launcher stopped."""
import json
import subprocess
import sys

from multihost.remote.run import files
from multihost.remote.run import processes as run_processes


def test_a_killed_wrappers_rank_is_dated_before_the_peers_its_launcher_stopped(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / "rank.0.json").write_text(json.dumps(
        {"local_rank": 0, "rank": 2, "ended": 100.0, "signal": 15, "exit_code": None,
         "wrapper": [1, None]}))
    (tmp_path / "rank.1.json").write_text(json.dumps(
        {"local_rank": 1, "rank": 3, "ended": None, "signal": None, "exit_code": None,
         "wrapper": [gone.pid, None]}))
    stopped, killed = files.rank_records(str(tmp_path))
    assert (killed["signal"], killed["wrapper_killed"]) == (9, True)
    assert killed["ended"] < stopped["ended"] == 100.0


def test_a_live_wrappers_rank_is_left_running(tmp_path):
    (tmp_path / "rank.0.json").write_text(json.dumps(
        {"local_rank": 0, "rank": 0, "ended": None, "signal": None, "exit_code": None,
         "wrapper": [subprocess.os.getpid(), run_processes.start_ticks(subprocess.os.getpid())]}))
    running, = files.rank_records(str(tmp_path))
    assert running["ended"] is None and "wrapper_killed" not in running


def _container(monkeypatch, processes):
    """A host whose processes are ``{host pid: (pid namespace, pid in there, ticks)}``;
    this process's namespace is the host's."""
    monkeypatch.setattr(run_processes, "_all_pids", lambda: list(processes) + [subprocess.os.getpid()])
    monkeypatch.setattr(run_processes, "_pid_namespace", lambda pid="self": "pid:[1]" if pid in (
        "self", subprocess.os.getpid()) else processes[pid][0])
    monkeypatch.setattr(run_processes, "_ns_pid", lambda pid: processes[pid][1])
    monkeypatch.setattr(run_processes, "is_alive", lambda pid, ticks=None: pid in processes and (
        ticks is None or processes[pid][2] == ticks))


def test_a_wrapper_inside_a_container_is_found_by_its_pid_in_there(tmp_path, monkeypatch):
    """run --image: the wrapper recorded pid 7 of its container's namespace; host pid 7
    is another process, so the wrapper is found as the container's pid 7, not declared
    killed (every rank of a torchrun inside an image was, at once)."""
    _container(monkeypatch, {7: ("pid:[1]", 7, 50), 4242: ("pid:[99]", 7, 1234)})
    record = {"local_rank": 0, "rank": 0, "ended": None, "signal": None, "exit_code": None,
              "wrapper": [7, 1234], "pidns": "pid:[99]"}
    (tmp_path / "rank.0.json").write_text(json.dumps(record))
    running, = files.rank_records(str(tmp_path))
    assert running["ended"] is None and "wrapper_killed" not in running

    _container(monkeypatch, {7: ("pid:[1]", 7, 1234), 4243: ("pid:[99]", 8, 1300)})
    killed, = files.rank_records(str(tmp_path))
    assert (killed["signal"], killed["wrapper_killed"]) == (9, True)
