"""A `multihost stop` from another shell (or Slurm's scancel) while a controller follows
the run: the ranks it kills are the stop's, not failures for the controller to act on.
Real processes on this machine, as test_launch_supervisor.py has them."""
from __future__ import annotations

import threading
import time

from multihost import helper
from multihost.run.outcome import failures_of, parse_status

from test_launch_supervisor import host, marked, start, status  # noqa: F401 (fixture)


def test_a_node_asked_to_stop_says_so_before_its_ranks_die_of_it(host):
    # Grandchildren that ignore SIGTERM keep the node in its grace period after the
    # ranks died: what the controller reads then must not be a failure.
    run_id, _ = start(host, args=["--child"], grace=5.0)
    deadline = time.monotonic() + 10
    while len(marked(run_id)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    stopper = threading.Thread(target=helper.call, args=(host, "run.stop", {
        "run_id": run_id, "grace": 1.0, "reason": "multihost stop from elsewhere"}))
    stopper.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            view = parse_status(status(host, run_id))
            if all(r.signal for r in view.ranks) and view.ranks:
                break
            assert time.monotonic() < deadline, view
            time.sleep(0.02)
        assert not view.finished and view.stopping is not None
        assert failures_of(0, "h1", view, now=time.time()) == []
    finally:
        stopper.join(30)
    final = parse_status(status(host, run_id))
    assert final.state == "stopped" and failures_of(0, "h1", final, now=time.time()) == []


def test_a_rank_that_failed_before_the_stop_is_still_a_failure():
    reply = {"state": "running", "node": {"state": "running", "stopping": 20.0},
             "ranks": [{"local_rank": 0, "rank": 0, "ended": 10.0, "exit_code": 3},
                       {"local_rank": 1, "rank": 1, "ended": 21.0, "signal": 15}]}
    (failure,) = failures_of(0, "h1", parse_status(reply), now=30.0)
    assert (failure.rank, failure.exit_code) == (0, 3)
