"""The restart policy (restarts.py): what is restarted, where each attempt's logs go."""
from __future__ import annotations

import pytest

from multihost.errors import ConfigError
from multihost.events import RootCause, RunState
from multihost.run.restarts import (attempt_label, attempt_log_dir, mirror_of, next_attempt,
                                restartable)
from multihost.run.outcome import AttemptEnd, Failure
from multihost.run.records import NodeRecord, RunRecord


def record(**changes):
    nodes = (NodeRecord(0, {"name": "h1"}, "h1", "10.0.0.1", 1, 0, state="failed", exit_code=3),
             NodeRecord(1, {"name": "h2"}, "h2", "10.0.0.2", 1, 1, state="stopped"))
    base = RunRecord("20250101-120000-ab12", 0.0, nodes, ("t.py",), "torchrun", "",
                     state="failed", exit_code=3, log_dir="/l/r/attempt_0", max_restarts=2,
                     root_cause=RootCause(host="h1", node_rank=0, rank=0, exit_code=3, reason="exit 3"))
    return RunRecord(**{**base.__dict__, **changes})


def test_without_restarts_the_mirror_layout_is_the_old_one():
    assert attempt_log_dir("/l/r", 0, 0) == "/l/r"
    assert attempt_log_dir("/l/r", 1, 2) == "/l/r/attempt_1"
    assert attempt_label(0, 0) == "" and attempt_label(1, 2) == "attempt 2 of 3"


def test_only_a_failure_with_a_root_cause_is_restarted():
    cause = Failure(1.0, 0, "h1", "rank", exit_code=3)
    assert restartable(AttemptEnd(RunState.FAILED, 3, cause=cause))
    assert not restartable(AttemptEnd(RunState.STOPPED, 130, cause=cause,
                                      interrupted=True))                # Ctrl-C
    assert not restartable(AttemptEnd(RunState.STOPPED, 143))         # `multihost stop`
    assert not restartable(AttemptEnd(RunState.SUCCEEDED, 0))


def test_the_next_attempt_keeps_the_failed_one_and_starts_every_node_afresh():
    after = next_attempt(record(), "/l/r/attempt_1", 17001)
    assert after.attempt == 1 and after.log_dir == "/l/r/attempt_1"
    assert [n.state for n in after.nodes] == ["pending", "pending"]
    assert after.root_cause is None and after.exit_code is None
    kept = after.attempts[0]
    assert kept["state"] == "failed" and kept["root_cause"]["rank"] == 0
    assert kept["log_dir"] == "/l/r/attempt_0" and kept["hosts"] == ["h1", "h2"]
    assert mirror_of(after, 1) == "/l/r/attempt_0" and mirror_of(after, 2) == "/l/r/attempt_1"


@pytest.mark.parametrize("attempt", [0, 3, -1])
def test_logs_attempt_outside_the_run_is_refused_with_the_range(attempt):
    with pytest.raises(ConfigError, match=r"has 2 attempt\(s\) so far") as caught:
        mirror_of(next_attempt(record(), "/l/r/attempt_1", 17001), attempt)
    assert caught.value.fix == "pick one of 1-2"
