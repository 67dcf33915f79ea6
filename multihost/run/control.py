"""``status`` and ``stop`` of a run from any shell, from its record alone (records.py).

Both ask every host of the run at once and reconcile the controller's record with what
the hosts say, so a run whose controller died still ends up with its final states, exit
codes and root cause recorded.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from .. import helper
from ..errors import MultihostError
from ..events import GpuSample, RunState
from .exits import decode_exit
from .outcome import Failure, NodeView, conclude, failures_of, parse_status, root_cause
from .records import RunRecord, cause_to_json, save_run

QUERY_TIMEOUT = 15.0


@dataclass(frozen=True)
class NodeStatus:
    node_rank: int
    host: str
    nproc: int
    rank_offset: int
    view: Optional[NodeView] = None
    error: Optional[MultihostError] = None
    gpu: Optional[GpuSample] = None     # the latest GPU sample of the log mirror

    @property
    def state(self) -> str:
        if self.view is not None:
            return self.view.state
        return "unreachable"

    def to_json(self) -> Dict[str, Any]:
        view = self.view
        data: Dict[str, Any] = {
            "node_rank": self.node_rank, "host": self.host, "state": self.state,
            "ranks": f"{self.rank_offset}-{self.rank_offset + self.nproc - 1}",
            "error": str(self.error) if self.error else None,
            "gpu": dataclasses.asdict(self.gpu) if self.gpu else None,
        }
        if view is not None:
            data.update({
                "procs": view.procs, "exit_code": view.exit_code, "signal": view.signal,
                "exit": decode_exit(view.exit_code, view.signal, view.state == "stopped")
                if view.finished else None,
                "started": view.started, "ended": view.ended, "detail": view.detail,
                "rank_exits": [dataclasses.asdict(r) for r in view.ranks]})
        else:
            data.update({"procs": None, "exit_code": None, "signal": None, "exit": None,
                         "started": None, "ended": None, "detail": "", "rank_exits": []})
        return data


@dataclass(frozen=True)
class RunStatus:
    record: RunRecord
    nodes: Tuple[NodeStatus, ...]

    @property
    def state(self) -> RunState:
        return self.record.state

    def to_json(self) -> Dict[str, Any]:
        record = self.record
        return {"run_id": record.run_id, "state": record.state.value, "exit_code": record.exit_code,
                "command": list(record.command), "launcher": record.launcher,
                "node0_command": record.node0_argv, "env": record.env,
                "start_port": record.start_port, "world_size": record.world_size,
                "created": record.created, "started": record.started, "ended": record.ended,
                "root_cause": cause_to_json(record.root_cause), "log_dir": record.log_dir,
                "git_commit": record.git_commit, "git_dirty": record.git_dirty,
                "attempt": record.attempt, "max_restarts": record.max_restarts,
                "attempts": list(record.attempts), "stragglers": list(record.stragglers),
                "replacements": list(record.replacements),
                "spares": [spare.get("name") for spare in record.spares],
                "nodes": [node.to_json() for node in self.nodes]}


def _node(record: RunRecord, rank: int, view=None, error=None) -> NodeStatus:
    node = record.nodes[rank]
    return NodeStatus(rank, node.label, node.nproc, node.rank_offset, view, error,
                      latest_gpu_sample(record, rank))


def latest_gpu_sample(record: RunRecord, rank: int) -> Optional[GpuSample]:
    """The host's newest GPU sample, from the gpu.log of the run's log mirror (written
    while a controller follows the run: `run`, or `logs --follow`)."""
    if not record.log_dir:
        return None
    from ..logs.mirror_layout import mirror_path
    from ..logs.gpus import latest_sample

    host = record.hosts[rank]
    return latest_sample(mirror_path(record.mirror_dir, host) / "gpu.log", rank, host.label)


def reconcile(record: RunRecord, nodes: Tuple[NodeStatus, ...]) -> RunRecord:
    """What the hosts said, written into the record; the run's end when all ended."""
    now = time.time()
    for status in nodes:
        if status.view is not None:
            view = status.view
            record = record.with_node(status.node_rank, state=view.state,
                                      exit_code=view.exit_code, signal=view.signal,
                                      ended=view.ended, detail=view.detail)
    views = [s.view for s in nodes]
    if record.finished or any(v is None or not v.finished for v in views):
        return record
    # Every node ended and no controller recorded it (it died, or was detached).
    failures: List[Failure] = []
    for status in nodes:
        # A stopped node had no failure before it was asked to stop (its supervisor
        # judged that): its ranks' deaths are the stop's doing, not causes.
        if status.view.state != "stopped":
            failures += failures_of(status.node_rank, status.host, status.view, now)
    end = conclude([v.state for v in views], root_cause(failures), False,
                   nodes=[(s.node_rank, s.host, s.view) for s in nodes])
    return dataclasses.replace(
        record, state=end.state, exit_code=end.exit_code,
        ended=max(v.ended or now for v in views), root_cause=end.root_cause)


def controller_gone(record: RunRecord) -> bool:
    """The run's record is not final and the controller that writes it, on this very
    machine, is gone (killed, or detached): its state is only as new as that controller's
    last word. Local knowledge only, for `status --list`; `status RUN` asks the hosts."""
    import os
    import socket

    ctl = record.controller or {}
    pid = ctl.get("pid")
    if record.finished or not isinstance(pid, int) or ctl.get("hostname") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False    # alive, someone else's
    return False


def query(cluster, record: RunRecord, save: bool = True) -> RunStatus:
    def one(host, transport):
        return parse_status(helper.call(transport, "run.status", {"run_id": record.run_id},
                                        timeout=QUERY_TIMEOUT))

    results = cluster.map(one)
    nodes = tuple(_node(record, r.host.rank, r.value, r.error) for r in results)
    updated = reconcile(record, nodes)
    if save and updated != record:
        save_run(updated)
    return RunStatus(updated, nodes)


def stop(cluster, record: RunRecord, grace: float, reason: str) -> RunStatus:
    """Stop the run on every host at once (SIGTERM, ``grace``, SIGKILL)."""
    def one(host, transport):
        return parse_status(helper.call(transport, "run.stop", {
            "run_id": record.run_id, "grace": grace, "reason": reason}, timeout=grace + 30))

    results = cluster.map(one)
    nodes = tuple(_node(record, r.host.rank, r.value, r.error) for r in results)
    updated = reconcile(record, nodes)
    if updated != record:
        save_run(updated)
    return RunStatus(updated, nodes)


def replaced_hosts(record: RunRecord) -> Tuple[Any, ...]:
    """The hosts a spare replaced after they were lost, as the attempt before recorded
    them: the run's processes may still run there (nothing could stop them then)."""
    from ..spares import host_key
    from .records import host_from_dict

    seen = {host_key(h) for h in record.hosts}
    out = []
    for entry in record.replacements:
        earlier = int(entry.get("attempt") or 0) - 1
        if entry.get("why") != "lost" or not 0 <= earlier < len(record.attempts):
            continue
        fields = record.attempts[earlier].get("host_fields") or []
        node = int(entry.get("node_rank") or 0)
        if node < len(fields):
            host = dataclasses.replace(host_from_dict(fields[node]), rank=len(out))
            if host_key(host) not in seen:
                seen.add(host_key(host))
                out.append(host)
    return tuple(out)


def stop_replaced(record: RunRecord, options, grace: float,
                  reason: str) -> List[Tuple[str, Optional[MultihostError]]]:
    """``stop`` on the hosts spares replaced (see ``replaced_hosts``): (label, error or
    None) for each."""
    from ..fanout import HostGroup

    hosts = replaced_hosts(record)
    if not hosts:
        return []

    def one(host, transport):
        return helper.call(transport, "run.stop", {"run_id": record.run_id, "grace": grace,
                                                   "reason": reason}, timeout=grace + 30)

    with HostGroup(hosts, options) as cluster:
        return [(r.host.label, r.error) for r in cluster.map(one)]


def ssh_options(record: RunRecord, *, ssh_config: Optional[str] = None,
                connect_timeout: Optional[float] = None):
    """How the run's hosts were reached (its record's ssh options, or srun steps of its
    Slurm job), unless told otherwise: for its commands, `multihost ssh` and `multihost
    fetch` alike."""
    from ..transport import SshOptions
    from ..transport.srun import from_record

    ssh = record.ssh or {}
    return from_record(ssh, SshOptions(
        connect_timeout=float(connect_timeout or ssh.get("connect_timeout") or 10.0),
        accept_new_host_keys=bool(ssh.get("accept_new_host_keys", False)),
        config_file=ssh_config or ssh.get("config_file") or "~/.ssh/config"))


def cluster_of(record: RunRecord, *, ssh_config: Optional[str] = None,
               connect_timeout: Optional[float] = None):
    """The hosts of a run, reached as the run was started unless told otherwise."""
    from ..fanout import HostGroup
    from ..waits import check_environment

    check_environment()   # a bad MULTIHOST_LOST_AFTER: one line, before a host is touched
    return HostGroup(record.hosts, ssh_options(record, ssh_config=ssh_config,
                                               connect_timeout=connect_timeout))
