"""What a run's last words say, in the plain view and under the dashboard's last frame:
where the logs are (as Paddle users look for them), and a failed attempt that restarts
said as the attempt's failure, never as the run's."""
from __future__ import annotations

import io

from multihost.events import RootCause, RunFinished
from multihost.views.dashboard import after_lines
from multihost.views.plain import PlainView

RUN = "20261127-101500-3f2a"
CAUSE = RootCause("h2", 1, 3, 1, "exit 1", tail=("ValueError: bad batch",))


def said(event):
    err = io.StringIO()
    PlainView(io.StringIO(), err)(event)
    return err.getvalue().splitlines()


def test_the_end_says_where_the_logs_are_latest_first():
    lines = said(RunFinished(RUN, 0, None, logs=f"log/{RUN}"))
    assert lines == [f"multihost: run {RUN} succeeded",
                     f"multihost: logs: log/latest/workerlog.N (this run: log/{RUN})"]


def test_a_failure_points_at_the_root_cause_ranks_log():
    lines = said(RunFinished(RUN, 1, CAUSE, logs=f"/tmp/x/log/{RUN}"))
    assert lines[0] == f"multihost: run {RUN} failed; root cause: h2 (node 1) rank 3: exit 1"
    assert lines[-1] == f"multihost: logs: /tmp/x/log/latest/workerlog.3 (this run: /tmp/x/log/{RUN})"


def test_an_attempts_logs_are_under_the_same_latest():
    event = RunFinished(RUN, 0, None, logs=f"log/{RUN}/attempt_1", attempt="attempt 2 of 2")
    assert said(event)[-1] == (f"multihost: logs: log/latest/workerlog.N "
                               f"(this run: log/{RUN}/attempt_1)")


def test_a_failed_attempt_that_restarts_is_not_the_runs_failure():
    event = RunFinished(RUN, 1, CAUSE, logs=f"log/{RUN}/attempt_0", attempt="attempt 1 of 2",
                        restarting="attempt 2 of 2")
    lines = said(event)
    assert lines == [f"multihost: run {RUN} attempt 1 of 2 failed: h2 (node 1) rank 3: exit 1; "
                     "restarting as attempt 2 of 2", "  | ValueError: bad batch"]
    assert after_lines(event) == [lines[0][len("multihost: "):]]


def test_a_stop_is_said_as_a_stop():
    assert said(RunFinished(RUN, 130, None))[0] == f"multihost: run {RUN} stopped (exit 130)"


def test_under_the_dashboard_the_logs_line_follows_the_last_frame():
    assert after_lines(RunFinished(RUN, 0, None, logs=f"log/{RUN}")) == [
        f"logs: log/latest/workerlog.N (this run: log/{RUN})"]
    assert after_lines(RunFinished(RUN, 0, None)) == []
