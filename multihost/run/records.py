"""The controller's record of every run: ``~/.multihost/runs/<run_id>/run.json``.

It holds all ``status``, ``stop`` and ``logs`` need to find a run again from any later
shell, even when the controller that started it died: the hosts (every field needed to
reconnect), ranks and processes per node, the command (secrets masked), the launcher,
the start port, times, states, exit codes, the git revision, the root cause, and where
the logs are mirrored. ``~/.multihost/last`` names the last run started here.

    record = load_run(None)          # the last run; or load_run("20250101-1200") by prefix
    record.hosts                     # Host objects in node-rank order, ready to reconnect
    record.nprocs, record.mirror_dir # processes per node; the controller's log mirror
    record.state                     # a RunState: RunState.RUNNING, RunState.FAILED, ...
    record.root_cause                # a RootCause (events/run.py) once the run failed
    record.nodes[1].state            # "running", "failed", ... (as the host said it)

Files are readable by the user only (0600 in a 0700 directory).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import ConfigError
from ..events import RootCause, RunState
from ..hosts import Host
from ..remote.run.states import FINAL_STATES

RUN_ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{4}$")
HOST_FIELDS = ("name", "rank", "user", "port", "identity_file", "workdir", "python", "gpus",
               "iface", "data", "slots")


def state_dir() -> Path:
    """``~/.multihost`` of the user running multihost (HOME decides, for tests too)."""
    return Path(os.path.expanduser("~")) / ".multihost"


def new_run_id(now: Optional[float] = None) -> str:
    """``YYYYmmdd-HHMMSS-xxxx`` in UTC: sortable, unique enough, printable."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class NodeRecord:
    node_rank: int
    host: Dict[str, Any]            # Host fields (see HOST_FIELDS)
    label: str
    address: str
    nproc: int
    rank_offset: int
    workdir: str = ""
    state: str = "pending"
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    detail: str = ""


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    created: float
    nodes: Tuple[NodeRecord, ...]
    command: Tuple[str, ...]        # what followed --, secrets masked
    launcher: str                   # template name or file
    node0_argv: str                 # node 0's rendered command, secrets masked
    env: Dict[str, str] = field(default_factory=dict)   # node 0's env, masked
    start_port: int = 0
    world_size: int = 0
    state: RunState = RunState.LAUNCHING
    exit_code: Optional[int] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    root_cause: Optional[RootCause] = None
    git_commit: Optional[str] = None
    git_dirty: Optional[bool] = None
    log_dir: str = ""               # the controller's mirror of this run: <--log_dir>/<run_id>
    kill_wait: float = 10.0
    allow_concurrent: bool = False
    ssh: Dict[str, Any] = field(default_factory=dict)   # connect_timeout, accept_new_host_keys
    controller: Dict[str, Any] = field(default_factory=dict)  # hostname, pid, cwd
    code_digest: Optional[str] = None   # the code tree's content hash (rerun --same-code)
    attempt: int = 0                # this attempt: 0, then 1, 2, ... (--max-restarts)
    max_restarts: int = 0
    attempts: Tuple[Dict[str, Any], ...] = ()   # the earlier attempts (restarts.summary)
    stragglers: Tuple[Dict[str, Any], ...] = ()  # ranks slower than the median (stragglers.to_json)
    replacements: Tuple[Dict[str, Any], ...] = ()   # spares.Replacement, every attempt's
    spares: Tuple[Dict[str, Any], ...] = ()     # the spares not used yet (host_to_dict)
    name: str = ""                  # --name: accepted wherever a run id is

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", RunState(self.state))  # typed, whoever made it

    @property
    def hosts(self) -> Tuple[Host, ...]:
        """Host objects in node-rank order, ready to reconnect."""
        return tuple(host_from_dict(node.host) for node in self.nodes)

    @property
    def nprocs(self) -> Tuple[int, ...]:
        """Processes per node, in node-rank order."""
        return tuple(node.nproc for node in self.nodes)

    @property
    def mirror_dir(self) -> Path:
        """Where the controller mirrors the rank logs: <log_dir>/<run_id>/<host>/..."""
        return Path(self.log_dir)

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    def with_node(self, node_rank: int, **changes: Any) -> "RunRecord":
        nodes = list(self.nodes)
        nodes[node_rank] = dataclasses.replace(nodes[node_rank], **changes)
        return dataclasses.replace(self, nodes=tuple(nodes))


def host_to_dict(host: Host) -> Dict[str, Any]:
    data = {name: getattr(host, name) for name in HOST_FIELDS}
    data["gpus"] = list(host.gpus) if host.gpus is not None else None
    data["data"] = list(host.data)
    return data


def host_from_dict(data: Dict[str, Any]) -> Host:
    fields = {k: v for k, v in data.items() if k in HOST_FIELDS}
    if fields.get("gpus") is not None:
        fields["gpus"] = tuple(fields["gpus"])
    fields["data"] = tuple(fields.get("data") or ())
    return Host(**fields)


def cause_to_json(cause: Optional[RootCause]) -> Optional[Dict[str, Any]]:
    """A root cause as run.json and ``status --json`` hold it."""
    if cause is None:
        return None
    data = dataclasses.asdict(cause)
    data["tail"] = list(cause.tail)
    data["after"] = list(cause.after)
    return data


def cause_from_json(data: Optional[Dict[str, Any]]) -> Optional[RootCause]:
    if not data:
        return None
    return RootCause(host=data.get("host", "?"), node_rank=data.get("node_rank", -1),
                     rank=data.get("rank"), exit_code=data.get("exit_code"),
                     reason=data.get("reason", ""), tail=tuple(data.get("tail") or ()),
                     local_rank=data.get("local_rank"), after=tuple(data.get("after") or ()),
                     kind=data.get("kind", "rank"))


def record_to_json(record: RunRecord) -> Dict[str, Any]:
    data = dataclasses.asdict(record)
    data["state"] = RunState(record.state).value
    data["root_cause"] = cause_to_json(record.root_cause)
    return data


def record_path(run_id: str) -> Path:
    return state_dir() / "runs" / run_id / "run.json"


def save_run(record: RunRecord, make_last: bool = False) -> Path:
    """Write run.json atomically (0600, directories 0700); optionally point ``last`` at it."""
    path = record_path(record.run_id)
    for directory in (state_dir(), path.parent.parent, path.parent):
        directory.mkdir(mode=0o700, exist_ok=True)
        if directory.stat().st_mode & 0o077 and not directory.is_symlink():
            # Left open by an older version, or made by this machine's own run (the
            # host side shares ~/.multihost/runs): the records hold commands and hosts.
            directory.chmod(0o700)
    _write_private(path, json.dumps(record_to_json(record), indent=1, sort_keys=True) + "\n")
    if make_last:
        _write_private(state_dir() / "last", record.run_id + "\n")
    return path


def job_file_path(run_id: str) -> Path:
    return record_path(run_id).with_name("job.toml")


def save_job_file(run_id: str, text: str) -> Path:
    """The run's resolved job file beside its run.json (0600; secrets already masked)."""
    path = job_file_path(run_id)
    for directory in (state_dir(), path.parent.parent, path.parent):
        directory.mkdir(mode=0o700, exist_ok=True)
    _write_private(path, text)
    return path


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


def record_from_dict(data: Dict[str, Any]) -> RunRecord:
    nodes = tuple(NodeRecord(**{k: v for k, v in node.items()
                                if k in NodeRecord.__dataclass_fields__})
                  for node in data.get("nodes", ()))
    fields = {k: v for k, v in data.items() if k in RunRecord.__dataclass_fields__}
    fields["nodes"] = nodes
    fields["command"] = tuple(fields.get("command") or ())
    fields["attempts"] = tuple(fields.get("attempts") or ())
    fields["stragglers"] = tuple(s for s in fields.get("stragglers") or () if isinstance(s, dict))
    fields["replacements"] = tuple(fields.get("replacements") or ())
    fields["spares"] = tuple(fields.get("spares") or ())
    fields["root_cause"] = cause_from_json(fields.get("root_cause"))
    return RunRecord(**fields)


def _read(path: Path, run_id: str) -> RunRecord:
    try:
        return record_from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"the record of run {run_id} at {path} is unreadable ({exc})",
                          fix="pick another run (multihost status --list)") from None


def run_ids() -> List[str]:
    """Every run recorded on this controller, oldest first."""
    root = state_dir() / "runs"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if RUN_ID_RE.match(p.name) and (p / "run.json").is_file())


def run_named(name: str) -> Optional[str]:
    """The newest run started from this controller with ``--name NAME``, or None."""
    for run_id in reversed(run_ids()):
        try:
            data = json.loads(record_path(run_id).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("name") == name:
            return run_id
    return None


def resolve_run_id(run_id: Optional[str]) -> str:
    """None: the last run. Otherwise a full id, a unique prefix of one, or a run's
    ``--name`` (the newest run of that name)."""
    if not run_id:
        try:
            last = (state_dir() / "last").read_text().strip()
        except OSError:
            last = ""
        if not last:
            raise ConfigError("no run has been started from this controller yet",
                              fix="start one with `multihost run`, or name a run id")
        return last
    known = run_ids()
    if run_id in known:
        return run_id
    named = None if RUN_ID_RE.match(run_id) else run_named(run_id)
    if named:
        return named
    matches = [r for r in known if r.startswith(run_id)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        # Another user's run (or one from another controller) is not recorded here: the
        # hosts' registries know it, and its logs are its controller's.
        raise ConfigError(f"no run {run_id!r} on this controller",
                          fix="`multihost status --list` lists this controller's runs; "
                              "`multihost status --all --ended --json` every user's on the hosts "
                              "of your last run, each with its controller (user@machine: where "
                              "its logs are)")
    raise ConfigError(f"{run_id!r} matches {len(matches)} runs ({', '.join(matches[:3])}...)",
                      fix="give more of the run id")


def load_run(run_id: Optional[str] = None) -> RunRecord:
    """The record of a run: the last one when ``run_id`` is None, else by id or prefix."""
    resolved = resolve_run_id(run_id)
    path = record_path(resolved)
    if not path.is_file():
        raise ConfigError(f"no record of run {resolved} in {path.parent}",
                          fix="list runs with `multihost status --list`")
    return _read(path, resolved)


def list_runs(limit: int = 20) -> List[RunRecord]:
    """The most recent runs, newest first (unreadable records are skipped)."""
    records = []
    for run_id in reversed(run_ids()):
        try:
            records.append(_read(record_path(run_id), run_id))
        except ConfigError:
            continue
        if len(records) >= limit:
            break
    return records
