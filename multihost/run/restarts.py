"""The restart policy of ``--max-restarts N`` (torchrun's name) and spare hosts, and what
an attempt leaves in the run's record, as pure functions (``lifecycle.py`` applies them).

After a failed attempt (a rank's non-zero exit or signal, a lost host, a hang) the run
was stopped on every host as always; if restarts are left, the preflight runs again and
the run is launched again under the same run id, as attempt k (``MULTIHOST_RESTART_COUNT``
and ``TORCHELASTIC_RESTART_COUNT`` = k in every process, so a script resumes from its
checkpoint). Every attempt keeps its own record, exit codes and root cause
(``RunRecord.attempts``), its own host files (``attempt_<k>/`` in the host's run
directory) and its own mirror (``<log_dir>/<run_id>/attempt_<k>/<host>/``).
``--max-restarts 0`` (the default) is one attempt, mirrored in the run's own directory.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Optional

from .records import RunRecord, cause_to_json


def attempt_label(attempt: int, max_restarts: int) -> str:
    """``attempt 2 of 3`` (counted from 1 for people), or '' for a run without restarts."""
    if not max_restarts:
        return ""
    return f"attempt {attempt + 1} of {max_restarts + 1}"


def attempt_log_dir(run_log_dir: str, attempt: int, max_restarts: int) -> str:
    """Where attempt k's lines are mirrored: the run's own directory when it has no
    restarts (as before), else ``attempt_<k>`` in it (torchrun's layout)."""
    if not max_restarts:
        return run_log_dir
    return os.path.join(run_log_dir, f"attempt_{attempt}")


def restart_budget(max_restarts: Optional[int], spares: int) -> int:
    """How many attempts may follow the first. ``--max-restarts N`` given: N. Not given:
    one per spare, and only to let a spare replace a lost host (see ``may_restart``)."""
    if max_restarts is not None:
        return max_restarts
    return spares


def may_restart(max_restarts: Optional[int], attempt: int, lost: bool,
                spares_left: int) -> bool:
    """Whether attempt ``attempt`` (0 first) that just failed is followed by another.
    With ``--max-restarts N``: while N restarts are left, whatever the failure (a spare
    replaces a lost host when one is left). Without it, a run with spares restarts only
    for a lost host that a spare can replace: a rank's own failure would fail again."""
    if max_restarts is not None:
        return attempt < max_restarts
    return lost and spares_left > 0


def restartable(end) -> bool:
    """A failure with a root cause (a rank, a lost host, a hang) is restarted; success,
    Ctrl-C, a stop from another shell and a detach are the user's own and never are, and
    a Slurm job that ended has no nodes left to restart on."""
    return end is not None and end.cause is not None \
        and end.cause.kind != "slurm" and not (end.interrupted or end.detached)


def summary(record: RunRecord) -> Dict[str, Any]:
    """What stays of a finished attempt in the run's record."""
    return {"attempt": record.attempt, "state": str(getattr(record.state, "value", record.state)),
            "exit_code": record.exit_code, "started": record.started, "ended": record.ended,
            "root_cause": cause_to_json(record.root_cause),
            "stragglers": list(record.stragglers),
            "log_dir": record.log_dir, "start_port": record.start_port,
            "hosts": [node.label for node in record.nodes],
            "host_fields": [dict(node.host) for node in record.nodes],
            "nodes": [{"label": n.label, "state": n.state, "exit_code": n.exit_code,
                       "signal": n.signal, "detail": n.detail} for n in record.nodes]}


def next_attempt(record: RunRecord, log_dir: str, start_port: int,
                 nodes: Optional[tuple] = None) -> RunRecord:
    """The record of the next attempt: the finished one moved into ``attempts``, every
    node pending again (on the hosts given, when a spare took a rank)."""
    fresh = tuple(dataclasses.replace(node, state="pending", exit_code=None, signal=None,
                                      started=None, ended=None, detail="")
                  for node in (nodes if nodes is not None else record.nodes))
    return dataclasses.replace(
        record, attempts=tuple(record.attempts) + (summary(record),), attempt=record.attempt + 1,
        nodes=fresh, state="launching", exit_code=None, started=None, ended=None,
        root_cause=None, stragglers=(), log_dir=log_dir, start_port=start_port, node0_argv="", env={})


def attempt_line(entry: Dict[str, Any], max_restarts: int) -> str:
    """One line per earlier attempt, for ``status``: ``attempt 1 of 3: failed (exit 3):
    h2 rank 3: exit 3``."""
    label = attempt_label(int(entry.get("attempt") or 0), max_restarts)
    text = f"{label}: {entry.get('state')}"
    if entry.get("exit_code") not in (None, 0):
        text += f" (exit {entry['exit_code']})"
    cause = entry.get("root_cause")
    if cause:
        where = f"rank {cause['rank']}" if cause.get("rank") is not None \
            else f"node {cause.get('node_rank')}"
        text += f": {cause.get('host')} {where}: {cause.get('reason')}"
    return text


def mirror_of(record: RunRecord, attempt: Optional[int]) -> str:
    """The mirror directory of attempt K (counted from 1, as shown), or of the current
    attempt when none is named."""
    from ..errors import ConfigError

    if attempt is None:
        return record.log_dir
    total = record.attempt + 1
    if not 1 <= attempt <= total:
        raise ConfigError(f"--attempt {attempt}: run {record.run_id} has "
                          f"{total} attempt(s) so far",
                          fix=f"pick one of 1-{total}")
    if attempt - 1 == record.attempt:
        return record.log_dir
    return str(record.attempts[attempt - 1].get("log_dir") or record.log_dir)
