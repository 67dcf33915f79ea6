"""A rank whose wrapper was killed (SIGKILL: it catches every other signal) leaves a
record without an end: it is read as killed just before the peers its launcher stopped."""
import json
import subprocess
import sys

from multihost.remote.run import files


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
         "wrapper": [subprocess.os.getpid(), files.start_ticks(subprocess.os.getpid())]}))
    running, = files.rank_records(str(tmp_path))
    assert running["ended"] is None and "wrapper_killed" not in running
