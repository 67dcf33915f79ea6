"""The events of a run: the states of a node and of a run, and what the run monitor, the
log follower and the straggler watch tell the views (see ``multihost/events``)."""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Tuple

from ..remote.run.states import FINAL_STATES

if TYPE_CHECKING:
    from ..run.stragglers import Straggler
    from ..check.parsers import GpuUse


class NodeState(str, enum.Enum):
    """The life of one node (one host) of a run, in the order it normally goes."""

    PENDING = "pending"
    SYNCING = "syncing"
    LAUNCHING = "launching"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"        # the controller cannot reach the host any more
    STOPPED = "stopped"  # ended by multihost (teardown after another failure, Ctrl-C, stop)
    STOPPING = "stopping"  # asked to stop, inside the grace period: not ended yet

    @property
    def finished(self) -> bool:
        return self.value in FINAL_STATES


class RunState(str, enum.Enum):
    """The life of a whole run, as its record on the controller tells it (the steps that
    move it are ``multihost/run/lifecycle.py``'s)::

        LAUNCHING --every node started--> RUNNING --every node ended--> SUCCEEDED (all exit 0)
            |                                                       --> FAILED (a root cause:
            +--a node could not start, or Ctrl-C--> FAILED / STOPPED     a rank, a lost host,
                                                                         a hang, --wait)
                                                                    --> STOPPED (Ctrl-C,
                                                                        `multihost stop`, [s])
        FAILED --a restart is left (--max-restarts, or a spare for a lost host)--> LAUNCHING
            as attempt k+1 under the same run id; attempt k is kept in ``RunRecord.attempts``

    A run that was detached stays RUNNING in its record until `status` or `stop` finds its
    end. SUCCEEDED, FAILED and STOPPED are final (``finished``) for the attempt.
    """

    LAUNCHING = "launching"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def finished(self) -> bool:
        return self.value in FINAL_STATES

    # Shown in messages and tables as its word ("failed"), as it was before it had a type.
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass(frozen=True)
class RunStarted:
    run_id: str
    hosts: Tuple[str, ...]          # labels, in node-rank order
    nproc_per_node: int
    command: str                    # for display; secrets already masked
    time: float
    attempt: str = ""               # "attempt 2 of 3" under --max-restarts, else ''
    replaced: Tuple[str, ...] = ()  # "h3 replaced by spare h5 (node 2)", this attempt's
    name: str = ""                  # --name


@dataclass(frozen=True)
class NodeChanged:
    node_rank: int
    host: str
    state: NodeState
    exit_code: Optional[int] = None
    detail: str = ""
    time: float = 0.0


def who(host: str, rank: int, role: str = "", local_rank: int = -1) -> str:
    """How a line's source is shown: ``host [3]``, ``host [server 0]``, ``host [launcher]``."""
    if role:
        return f"{host} [{role} {local_rank}]"
    return f"{host} [{rank}]" if rank >= 0 else f"{host} [launcher]"


@dataclass(frozen=True)
class LogLine:
    node_rank: int
    host: str
    local_rank: int
    rank: int                       # global rank
    text: str                       # one line, without its newline, decoded safely
    time: float = 0.0
    role: str = ""                  # "server": a parameter server's line (rank -1)

    @property
    def who(self) -> str:
        return who(self.host, self.rank, self.role, self.local_rank)


@dataclass(frozen=True)
class LogBlock:
    """Consecutive lines of one rank, as they arrived together, joined by newlines (no
    trailing one). Log followers emit blocks so that a job printing a million lines a
    second costs a few calls, not a million; views that need lines split them lazily."""

    node_rank: int
    host: str
    local_rank: int
    rank: int
    text: str
    time: float = 0.0
    role: str = ""                  # "server": a parameter server's lines (rank -1)

    @property
    def who(self) -> str:
        return who(self.host, self.rank, self.role, self.local_rank)

    @functools.cached_property
    def lines(self) -> List[str]:
        return self.text.split("\n")

    def count(self) -> int:
        return self.text.count("\n") + 1

    def last(self, n: int) -> List[str]:
        """The last n lines, without splitting the whole block."""
        return self.text.rsplit("\n", n)[-n:]

    def split(self) -> Tuple[LogLine, ...]:
        return tuple(LogLine(self.node_rank, self.host, self.local_rank, self.rank, text, self.time,
                             self.role) for text in self.lines)


@dataclass(frozen=True)
class LogProgress:
    """A rank's line that is being rewritten in place (a tqdm, Lightning or Hugging Face
    progress bar: ``\\r`` updates, no newline yet): its latest state, cleaned. Views read
    its numbers and show it as the rank's last line; it is no line of the log (the line
    arrives as a LogBlock once it ends)."""

    node_rank: int
    host: str
    local_rank: int
    rank: int
    text: str
    time: float = 0.0
    role: str = ""

    @property
    def who(self) -> str:
        return who(self.host, self.rank, self.role, self.local_rank)


@dataclass(frozen=True)
class Notice:
    """Something multihost says about a host that is not a change of its state (its log
    mirror fell behind, or caught up)."""

    node_rank: int
    host: str
    text: str
    time: float = 0.0


@dataclass(frozen=True)
class GpuSample:
    """One sample of a host's GPUs during a run (its gpu.log): the run's GPUs on that
    host, and those idle (at most IDLE_UTIL % busy) for two samples or more in a row."""

    node_rank: int
    host: str
    time: float                     # when the host took it
    gpus: Tuple[GpuUse, ...]
    idle: Tuple[int, ...] = ()      # GPU indices


@dataclass(frozen=True)
class RootCause:
    """The first failure by time: the failure that explains the run's end."""

    host: str
    node_rank: int
    rank: Optional[int]             # global rank when known
    exit_code: Optional[int]
    reason: str                     # decoded: "exit 3", "killed by SIGKILL (out of memory?)", "host lost"
    tail: Tuple[str, ...] = field(default_factory=tuple)
    local_rank: Optional[int] = None   # the rank on its host, when known (names its log)
    after: Tuple[str, ...] = field(default_factory=tuple)   # the ranks that stopped after it
    kind: str = "rank"              # run/outcome.Failure.kind: "slurm" when Slurm ended the job


@dataclass(frozen=True)
class RunStopping:
    """multihost has asked every host still running to stop: SIGTERM and up to ``grace``
    seconds before SIGKILL (``grace`` 0: SIGKILL now). Said at once, so a Ctrl-C is seen
    to be acknowledged long before the hosts have stopped."""

    reason: str                     # what the hosts record, e.g. "interrupted (Ctrl-C ...)"
    hosts: int                      # how many were asked
    grace: float
    interrupted: bool = False       # a Ctrl-C (or the dashboard's stop): a second one kills now
    time: float = 0.0


@dataclass(frozen=True)
class RunFinished:
    """An attempt's end: the run's, unless ``restarting`` names the attempt that follows."""

    run_id: str
    exit_code: int
    root_cause: Optional[RootCause] = None
    time: float = 0.0
    logs: str = ""                  # the controller's mirror of this attempt ('': none)
    attempt: str = ""               # "attempt 1 of 3" under --max-restarts, else ''
    restarting: str = ""            # "attempt 2 of 3" when one follows this failure, else ''


@dataclass(frozen=True)
class Stragglers:
    """The ranks now more than 20% slower than the median rank (run/stragglers.py),
    said when the list changes; empty: none any more."""

    stragglers: Tuple["Straggler", ...]
    text: str                       # as the views say it: "h3 rank 5 at 0.62x the median speed"
    time: float = 0.0
