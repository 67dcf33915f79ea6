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
import threading
import time
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
from .mirror_layout import (Node, link_latest, local_rank_of, make_private_dirs, mirror_path,
                            nodes_of, private_opener, role_of, times_path)
from ..untrusted import GPU_LOG, as_int, clean_block, clean_line, clean_text

RETRY_EVERY = 3.0
SPARE_BYTES = 1 << 20   # free space a mirror behind waits for, beyond what it lacks


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
