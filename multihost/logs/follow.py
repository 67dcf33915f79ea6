"""Follow every rank's log on every host, mirror it byte for byte on the controller, and
emit the lines as LogBlock events (consecutive lines of one rank that arrived together).

The mirror is the source of truth for resuming: each host's stream starts at the sizes
of its mirror files, so a reattach after a disconnect or a controller crash neither
loses nor repeats a byte. Lines are emitted whole and in order per file; files of one
host are read by one thread, hosts in parallel.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .. import helper, waits
from ..errors import BadReply, ConnectError, MultihostError
from ..events import Listener, LogBlock, LogProgress, NodeChanged, NodeState, Notice
from ..hosts import Host
from ..remote.run.states import FINAL_STATES
from .echo import ConfigBlock, LauncherEcho, fold_signal_trace
from .frames import LineJoiner, read_frame
from .gpus import GpuFeed
from ..sync.ignore import MIRROR_MARKER
from ..untrusted import GPU_LOG, as_int, clean_block, clean_line, clean_text

RETRY_EVERY = 3.0
SPARE_BYTES = 1 << 20   # free space a mirror behind waits for, beyond what it lacks


def mirror_path(mirror_dir: Path, host: Host) -> Path:
    return mirror_dir / host.label.replace("/", "_")


def times_path(log_file: Path) -> Path:
    """Beside each mirror file: when each chunk arrived, for ``logs --since``."""
    return log_file.with_name(f".{log_file.name}.times")


def local_rank_of(name: str) -> int:
    """workerlog.3 -> 3 (serverlog.3 -> 3, see role_of); the launcher's own log -> -1."""
    match = re.search(r"(\d+)$", name)
    return int(match.group(1)) if match and name.startswith("log/") else -1


def role_of(name: str) -> str:
    """"server" for a parameter server's log (paddle's serverlog.N); "" for a rank's."""
    return "server" if name.startswith("log/serverlog.") else ""


@dataclass(frozen=True)
class Node:
    host: Host
    nproc: int
    first_rank: int      # global rank of the node's local rank 0
    first_server: int = 0   # a parameter-server job: the index of the node's serverlog.0


def link_latest(mirror_dir: Path, nodes: Sequence[Node]) -> Path:
    """Where Paddle users look: ``<log_dir>/latest`` names the newest run's mirror, and in
    it ``workerlog.<global rank>`` each rank's log (``tail -f log/latest/workerlog.3``).
    Links, so the mirror stays one copy; each made aside and renamed over the old one, so
    a reader never finds the name missing."""
    for node in nodes:
        label = mirror_path(Path("."), node.host).name
        for local in range(node.nproc):
            _relink(mirror_dir / f"workerlog.{node.first_rank + local}",
                    f"{label}/log/workerlog.{local}")
    latest = latest_link(mirror_dir)
    _relink(latest, os.path.relpath(mirror_dir, latest.parent))
    return latest


def latest_link(mirror_dir) -> Path:
    """``<log_dir>/latest``, for a run's mirror ``<log_dir>/<run_id>`` or for an attempt's
    ``<log_dir>/<run_id>/attempt_<k>`` (--max-restarts): the newest attempt is the latest."""
    mirror_dir = Path(mirror_dir)
    root = mirror_dir.parent
    if mirror_dir.name.startswith("attempt_"):
        root = root.parent
    return root / "latest"


def _relink(link: Path, target: str) -> None:
    """Point ``link`` at ``target``; only a link is ever replaced (a file or directory of
    that name is someone's, kept, and the OSError says so)."""
    import errno
    import secrets

    if os.path.lexists(link) and not os.path.islink(link):
        kind = "directory" if os.path.isdir(link) else "file"
        raise OSError(errno.EEXIST, f"{link} is a {kind}, not a link: kept as it is")
    aside = link.with_name(f".{link.name}.{secrets.token_hex(8)}")   # a name nobody planted
    os.symlink(target, aside)
    try:
        os.replace(aside, link)
    except OSError:
        aside.unlink()   # nothing left beside it
        raise


def nodes_of(hosts_nprocs: Sequence[Tuple[Host, int]],
             first_servers: Sequence[int] = ()) -> List[Node]:
    nodes, first = [], 0
    for i, (host, nproc) in enumerate(hosts_nprocs):
        nodes.append(Node(host, nproc, first, first_servers[i] if i < len(first_servers) else 0))
        first += nproc
    return nodes


class LogFollower:
    """Tail a run's logs on every host; ``listener`` gets LogBlock (and NodeChanged for a
    host that is lost or comes back, and a node whose state file says it finished)."""

    def __init__(self, cluster, run_id: str, nodes: Sequence[Tuple[Host, int]],
                 mirror_dir: Path, listener: Listener, *, follow: bool = True,
                 report_states: bool = True, latest: bool = False,
                 first_servers: Sequence[int] = ()):
        self.cluster = cluster
        self.run_id = run_id
        self.nodes = nodes_of(nodes, first_servers)
        self.mirror_dir = Path(mirror_dir)
        self.listener = listener
        self.follow = follow
        # `run` has its own monitor for node states; `logs --follow` relies on these.
        self.report_states = report_states
        self._lost: Dict[int, bool] = {}
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._ended: Dict[int, threading.Event] = {n.host.rank: threading.Event() for n in self.nodes}
        self.final_states: Dict[int, Optional[dict]] = {}
        self._echoes: Dict[int, LauncherEcho] = {n.host.rank: LauncherEcho() for n in self.nodes}
        self._configs = {n.host.rank: ConfigBlock() for n in self.nodes[1:]}   # shown for node 0
        self._gpus = GpuFeed()     # gpu.log: samples, not lines
        self.errors: Dict[int, MultihostError] = {}
        self.mirror_behind: Dict[int, str] = {}   # host rank -> why its mirror lacks lines
        self.latest = latest      # the run's own follower: log/latest names this run

    def start(self) -> "LogFollower":
        if self.latest:
            try:
                link_latest(self.mirror_dir, self.nodes)
            except OSError as err:  # the mirror itself still works: say so, once
                self.listener(Notice(-1, "controller", f"log/latest not updated: {err.strerror or err}",
                                     time.time()))
        for node in self.nodes:
            thread = threading.Thread(target=self._follow_node, args=(node,),
                                      name=f"logs-{node.host.label}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def drain(self, timeout: Optional[float] = None) -> bool:
        """Wait until every host has sent everything (its node finished); True if all did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for event in self._ended.values():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not event.wait(left):
                return False
        return True

    def stop(self) -> None:
        """Stop following, waiting 2 s in all for the threads to end: not 2 s for each,
        as each lost host's thread stays blocked until its read times out."""
        self._stop.set()
        deadline = time.monotonic() + 2
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- one host -----------------------------------------------------------------------
    def _follow_node(self, node: Node) -> None:
        host = node.host
        directory = mirror_path(self.mirror_dir, host)
        make_private_dirs(directory)
        # One writer per mirror: a second follower of the same run (`logs --follow` beside
        # a live `run`) streams from the same offsets but leaves the mirror to the owner.
        lock = open(directory / ".lock", "a", opener=private_opener)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            owner = True
        except OSError:
            owner = False
        mirror = HostMirror(directory, owner, lambda text: self._notice(host, text))
        try:
            self._follow_loop(node, mirror)
        finally:
            lock.close()
            self._ended[host.rank].set()

    def _follow_loop(self, node: Node, mirror: "HostMirror") -> None:
        host = node.host
        fed = dict(mirror.sizes)  # bytes of each file given to its line joiner: shown
        joiners: Dict[str, LineJoiner] = {}
        while not self._stop.is_set():
            try:
                done = self._stream(node, mirror, fed, joiners)
                if done:
                    break
                if done is None:
                    continue  # the mirror has room again: stream what it lacks
            except BadReply as err:  # never retried: what it says cannot be trusted
                self.errors[host.rank] = err
                break
            except MultihostError as err:
                self.errors[host.rank] = err
                if not self.follow:
                    break
            except (OSError, EOFError) as err:  # a stream that died mid-read
                self.errors[host.rank] = ConnectError(f"log stream lost: {err or type(err).__name__}",
                                                      host=host.label, kind=ConnectError.LOST)
            if not self.follow:
                break
            if not self._lost.get(host.rank):
                self._lost[host.rank] = True
                self._report(NodeChanged(host.rank, host.label, NodeState.LOST,
                                         detail=str(self.errors.get(host.rank, "no answer")),
                                         time=time.time()))
            self.cluster.forget(host)
            self._stop.wait(RETRY_EVERY)
        self.mirror_behind[host.rank] = mirror.behind

    def _stream(self, node: Node, mirror: "HostMirror", fed: Dict[str, int],
                joiners: Dict[str, LineJoiner]) -> Optional[bool]:
        """One connection's worth of streaming: True when the host said it is done, None
        when the mirror can catch up now (stream again from its sizes)."""
        host = node.host
        transport = self.cluster.transport(host)
        # The stream starts where the mirror ends; lines already shown are not shown again.
        start = dict(mirror.sizes) if mirror.owner else dict(fed)
        process = helper.start(transport, "logs.tail", {
            "run_id": self.run_id, "offsets": start,
            "follow": self.follow, "compress": not transport.is_local,
            "quick_for": waits.quick_start(len(self.nodes)) if self.follow else 0})
        process.stdin.close()
        # No frame (heartbeats come every 2 s) for as long as a run's host takes to be lost.
        process.set_timeout(waits.lost_after())
        if self._lost.pop(host.rank, False):
            self._report(NodeChanged(host.rank, host.label, NodeState.RUNNING,
                                     detail="contact restored", time=time.time()))
        expected = start
        try:
            while not self._stop.is_set():
                frame = read_frame(process.stdout, host.label)
                if frame is None:
                    raise ConnectError("log stream ended early", host=host.label,
                                       kind=ConnectError.LOST)
                if frame.kind == "D":
                    name, offset, data = frame.name, frame.offset, frame.data
                    if expected.get(name, 0) != offset:
                        continue  # never a byte twice, never a hole
                    expected[name] = offset + len(data)
                    mirror.write(name, offset, data)
                    new = fed.get(name, 0) - offset
                    if new < len(data):
                        fed[name] = offset + len(data)
                        self._lines(node, name, data[max(new, 0):], joiners)
                    if mirror.can_catch_up(fed):
                        return None
                elif frame.kind == "H":
                    if mirror.can_catch_up(fed):
                        return None
                elif frame.kind == "S":
                    self._state(node, frame.record)
                elif frame.kind == "E":
                    if mirror.can_catch_up(fed, wait=False):
                        return None  # the end, but the mirror lacks lines it can take now
                    self.final_states[host.rank] = final_state(frame.record)
                    for name, joiner in joiners.items():
                        rest = joiner.flush()
                        if rest:
                            self._emit(node, name, rest)
                    return True
            return True
        finally:
            process.close()

    def _lines(self, node: Node, name: str, data: bytes, joiners: Dict[str, LineJoiner]) -> None:
        """Whole lines go out as one block; a trailing partial line waits for its end."""
        joiner = joiners.get(name)
        if joiner is None:
            joiner = joiners[name] = LineJoiner()
        whole = joiner.feed(data)
        if whole:
            self._emit(node, name, whole)
        state = joiner.progress_update() if name != GPU_LOG else b""
        if state:
            self._progress(node, name, state)

    def _progress(self, node: Node, name: str, state: bytes) -> None:
        """A bar's latest state: at most one per file and frame, whatever the bar's rate."""
        text = clean_line(state).strip()
        if not text:
            return
        local = local_rank_of(name)
        role = role_of(name)
        rank = -1 if role or local < 0 else node.first_rank + local
        self.listener(LogProgress(node.host.rank, node.host.label, local, rank, text,
                                  time.time(), role))

    def _emit(self, node: Node, name: str, data: bytes) -> None:
        if name == GPU_LOG:
            for sample in self._gpus.events(node.host.rank, node.host.label, data):
                self.listener(sample)
            return
        local = local_rank_of(name)
        text: Optional[str] = clean_block(data)
        if role_of(name):   # labelled by its server index across the job, not its log's N
            self.listener(LogBlock(node.host.rank, node.host.label, node.first_server + local,
                                   -1, text, time.time(), role_of(name)))
            return
        echo = self._echoes[node.host.rank]
        if local == 0:
            echo.rank0(text)
        elif local < 0:
            text = echo.launcher(fold_signal_trace(text))   # paddle's copy of rank 0's lines: once
            config = self._configs.get(node.host.rank)
            if text is not None and config is not None:
                text = config.strip(text)
            if text is None:
                return
        self.listener(LogBlock(node.host.rank, node.host.label, local,
                               node.first_rank + local if local >= 0 else -1,
                               text, time.time()))

    def _report(self, event: NodeChanged) -> None:
        if self.report_states:
            self.listener(event)

    def _notice(self, host: Host, text: str) -> None:
        self.listener(Notice(host.rank, host.label, text, time.time()))

    def _state(self, node: Node, state: object) -> None:
        if not isinstance(state, dict) or state.get("state") not in FINAL_STATES:
            return
        self._report(NodeChanged(node.host.rank, node.host.label, NodeState(state["state"]),
                                 exit_code=as_int(state.get("exit_code")), time=time.time()))


class HostMirror:
    """One host's mirror files, written only at their ends: a write that fails (a full
    disk) leaves the mirror behind, said once; it catches up once there is room again."""

    def __init__(self, directory: Path, owner: bool, notice: Callable[[str], None]):
        self.directory = directory
        self.owner = owner
        self.notice = notice
        self.sizes = {name: (directory / name).stat().st_size for name in _mirror_names(directory)}
        self.behind = ""              # why the mirror lacks bytes already shown, or ""
        self._checked = 0.0

    def write(self, name: str, offset: int, data: bytes) -> None:
        if not self.owner or self.sizes.get(name, 0) != offset:
            return  # behind: these bytes wait for the catch-up stream
        path = self.directory / name
        try:
            make_private_dirs(path.parent)
            with open(path, "ab", opener=private_opener) as mirror:
                if mirror.tell() != offset:  # the mirror was changed behind our back: keep it
                    return
                mirror.write(data)
        except OSError as err:
            self._fell_behind(name, path, err)
            return
        self.sizes[name] = offset + len(data)
        try:
            with open(times_path(path), "a", opener=private_opener) as index:
                index.write(f"{offset} {time.time():.3f}\n")
        except OSError:
            pass  # only --since reads it: those lines count as arrived with the ones before

    def _fell_behind(self, name: str, path: Path, err: OSError) -> None:
        try:
            self.sizes[name] = path.stat().st_size  # what did reach the disk stays
        except OSError:
            self.sizes[name] = 0
        if not self.behind:
            why = "no space left on the controller's disk" if err.errno in (
                errno.ENOSPC, errno.EDQUOT) else clean_text(err.strerror or str(err))
            self.behind = why
            self.notice(f"the log mirror {self.directory} is behind ({why}); lines are "
                        f"still shown, and the mirror catches up when it can be written")

    def can_catch_up(self, fed: Dict[str, int], wait: bool = True) -> bool:
        """Behind, and (checked every few seconds unless not ``wait``) the disk has room
        for what it lacks."""
        if not self.behind:
            return False
        lacking = sum(max(0, fed.get(name, 0) - self.sizes.get(name, 0)) for name in fed)
        if not lacking:
            self.behind = ""
            self.notice(f"the log mirror {self.directory} has caught up")
            return False
        now = time.monotonic()
        if wait and now - self._checked < RETRY_EVERY:
            return False
        self._checked = now
        try:
            room = os.statvfs(self.directory)
        except OSError:
            return False
        return room.f_bavail * room.f_frsize > lacking + SPARE_BYTES


def final_state(record: object) -> Optional[dict]:
    """A node's last record, from its ``E`` frame, with only the fields read, typed."""
    if not isinstance(record, dict):
        return None
    return {"state": clean_text(record.get("state")), "exit_code": as_int(record.get("exit_code")),
            "error": clean_text(record.get("error"))}


def _mirror_names(directory: Path) -> List[str]:
    names = []
    for name in ("launcher.log", GPU_LOG):
        if (directory / name).is_file():
            names.append(name)
    log = directory / "log"
    if log.is_dir():
        names += [f"log/{p.name}" for p in sorted(log.iterdir())
                  if p.is_file() and not p.name.startswith(".")]
    return names


def make_private_dirs(directory: Path) -> None:
    """``mkdir -p`` where every directory made is the user's only (``parents=True`` would
    give the parents the umask's mode)."""
    if directory.is_dir():
        return
    make_private_dirs(directory.parent)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass


def private_opener(path, flags: int) -> int:
    """For open(): a new file is the user's only (a log can hold what the job printed)."""
    return os.open(path, flags, 0o600)


def ensure_private(directory: Path) -> Path:
    """Log mirrors can hold secrets printed by the job: readable by the user only. The
    marker beside the runs keeps code sync from shipping old logs back to the hosts
    (``./log`` usually sits inside the code directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    for place in (directory, directory.parent):
        marker = place / MIRROR_MARKER
        if not marker.exists():
            try:
                marker.touch(mode=0o600)
            except OSError:
                pass
    return directory
