"""A host's status never shows a rank that its stop ended without the stop itself: on a
loaded host the supervisor can record the stop, signal a rank and see it end between
the status's reads, and the controller would then blame the rank the stop ended."""
import json
import os

from multihost.remote.run import files, ops
from multihost.remote.run import processes
from multihost.run.outcome import failures_of, parse_status


def test_a_rank_ended_by_a_stop_between_the_reads_comes_with_the_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    run_id = "20261203-235900-ab12"
    run_dir = files.run_dir(run_id)
    os.makedirs(run_dir)
    node_path = os.path.join(run_dir, "node.json")
    node = {"run_id": run_id, "state": "running",   # this process plays the supervisor
            "supervisor": {"pid": os.getpid(), "ticks": processes.start_ticks(os.getpid())}}
    with open(node_path, "w") as out:
        json.dump(node, out)
    with open(os.path.join(run_dir, "rank.0.json"), "w") as out:
        json.dump({"local_rank": 0, "rank": 0, "ended": 100.5, "exit_code": None,
                   "signal": 15}, out)
    read_ranks = files.rank_records

    def stopped_meanwhile(path):   # the supervisor, between the reads: stop, then signal
        with open(node_path, "w") as out:
            json.dump(dict(node, stopping=100.0), out)
        return read_ranks(path)
    monkeypatch.setattr(files, "rank_records", stopped_meanwhile)
    reply = ops.status({"run_id": run_id})
    assert reply["node"]["stopping"] == 100.0
    assert failures_of(0, "h1", parse_status(reply), now=101.0) == []
