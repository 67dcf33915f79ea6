"""Follow every rank's log on every host, mirror it byte for byte on the controller, and
emit the lines as LogBlock events (consecutive lines of one rank that arrived together).

The mirror is the source of truth for resuming: each host's stream starts at the sizes
of its mirror files, so a reattach after a disconnect or a controller crash neither
loses nor repeats a byte. Lines are emitted whole and in order per file; files of one
host are read by one thread, hosts in parallel.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import helper
from .errors import ConnectError, MultihostError
from .events import LogBlock, NodeChanged, NodeState
from .hosts import Host
from .log_echo import LauncherEcho
from .sync_ignore import MIRROR_MARKER

REMOTE_RUNS = "~/.multihost/runs"
LOST_AFTER = 15.0       # seconds without a frame (heartbeats come every 2 s)
RETRY_EVERY = 3.0
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_NEEDS_CLEANING = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # \r and ESC are in this range
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def clean_line(raw: bytes) -> str:
    """A line safe to show anywhere: valid text, the last state of a \\r progress bar,
    no terminal escapes or control characters."""
    text = raw.decode("utf-8", "replace").rstrip("\n")
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    text = _ANSI.sub("", text)
    return _CONTROL.sub("\ufffd", text)


def mirror_path(mirror_dir: Path, host: Host) -> Path:
    return mirror_dir / host.label.replace("/", "_")


def clean_block(data: bytes) -> str:
    """``clean_line`` for a block of whole lines, joined by newlines; a clean block (the
    usual case) costs one decode and one scan, at C speed, whatever its number of lines."""
    text = data.decode("utf-8", "replace")
    if text.endswith("\n"):
        text = text[:-1]
    if not _NEEDS_CLEANING.search(text):
        return text
    return "\n".join(clean_line(line.encode("utf-8")) if _NEEDS_CLEANING.search(line) else line
                     for line in text.split("\n"))


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


def nodes_of(hosts_nprocs: Sequence[Tuple[Host, int]]) -> List[Node]:
    nodes, first = [], 0
    for host, nproc in hosts_nprocs:
        nodes.append(Node(host, nproc, first))
        first += nproc
    return nodes


class LogFollower:
    """Tail a run's logs on every host; ``listener`` gets LogBlock (and NodeChanged for a
    host that is lost or comes back, and a node whose state file says it finished)."""

    def __init__(self, cluster, run_id: str, nodes: Sequence[Tuple[Host, int]],
                 mirror_dir: Path, listener: Callable[[object], None], *, follow: bool = True,
                 report_states: bool = True):
        self.cluster = cluster
        self.run_id = run_id
        self.nodes = nodes_of(nodes)
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
        self.errors: Dict[int, MultihostError] = {}

    def start(self) -> "LogFollower":
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
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)

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
        offsets = {name: (directory / name).stat().st_size for name in _mirror_names(directory)}
        try:
            self._follow_loop(node, directory, offsets, owner)
        finally:
            lock.close()
            self._ended[host.rank].set()

    def _follow_loop(self, node: Node, directory: Path, offsets: Dict[str, int],
                     owner: bool) -> None:
        host = node.host
        while not self._stop.is_set():
            try:
                if self._stream(node, directory, offsets, owner):
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

    def _stream(self, node: Node, directory: Path, offsets: Dict[str, int], owner: bool) -> bool:
        """One connection's worth of streaming; True when the host said it is done."""
        host = node.host
        transport = self.cluster.transport(host)
        process = helper.start(transport, "logs.tail", {
            "run_dir": f"{REMOTE_RUNS}/{self.run_id}", "offsets": offsets,
            "follow": self.follow, "compress": not transport.is_local})
        process.stdin.close()
        process.set_timeout(LOST_AFTER)
        if self._lost.pop(host.rank, False):
            self._report(NodeChanged(host.rank, host.label, NodeState.RUNNING,
                                     detail="contact restored", time=time.time()))
        buffers: Dict[str, bytes] = {}
        try:
            while not self._stop.is_set():
                header = process.stdout.readline()
                if not header:
                    raise ConnectError("log stream ended early", host=host.label,
                                       kind=ConnectError.LOST)
                kind, _, rest = header.decode("utf-8", "replace").rstrip("\n").partition(" ")
                if kind in ("D", "Z"):
                    if kind == "D":
                        name, offset, length = rest.rsplit(" ", 2)
                        data = _read_exact(process.stdout, int(length))
                    else:
                        name, offset, length, packed = rest.rsplit(" ", 3)
                        data = zlib.decompress(_read_exact(process.stdout, int(packed)))
                        if len(data) != int(length):
                            raise ConnectError("a log frame arrived damaged", host=host.label,
                                               kind=ConnectError.PROTOCOL)
                    if offsets.get(name, 0) != int(offset):
                        continue  # never a byte twice, never a hole
                    offsets[name] = int(offset) + len(data)
                    if owner:
                        self._write_mirror(directory / name, int(offset), data)
                    self._lines(node, name, data, buffers)
                elif kind == "S":
                    self._state(node, json.loads(rest))
                elif kind == "E":
                    self.final_states[host.rank] = json.loads(rest)
                    for name, rest_bytes in buffers.items():
                        if rest_bytes:
                            self._emit(node, name, rest_bytes)
                    return True
            return True
        finally:
            process.close()

    @staticmethod
    def _write_mirror(path: Path, offset: int, data: bytes) -> None:
        make_private_dirs(path.parent)
        with open(path, "ab", opener=private_opener) as mirror:
            if mirror.tell() != offset:  # the mirror was changed behind our back: keep it
                return
            mirror.write(data)
        with open(times_path(path), "a", opener=private_opener) as index:
            index.write(f"{offset} {time.time():.3f}\n")

    def _lines(self, node: Node, name: str, data: bytes, buffers: Dict[str, bytes]) -> None:
        """Whole lines go out as one block; a trailing partial line waits for its end."""
        pending = buffers.get(name, b"") + data
        cut = pending.rfind(b"\n") + 1
        buffers[name] = pending[cut:]
        if cut:
            self._emit(node, name, pending[:cut])

    def _emit(self, node: Node, name: str, data: bytes) -> None:
        local = local_rank_of(name)
        text: Optional[str] = clean_block(data)
        if role_of(name):
            self.listener(LogBlock(node.host.rank, node.host.label, local, -1, text, time.time(),
                                   role_of(name)))
            return
        echo = self._echoes[node.host.rank]
        if local == 0:
            echo.rank0(text)
        elif local < 0:
            text = echo.launcher(text)   # paddle's copy of rank 0's lines: shown once
            if text is None:
                return
        self.listener(LogBlock(node.host.rank, node.host.label, local,
                               node.first_rank + local if local >= 0 else -1,
                               text, time.time()))

    def _report(self, event: NodeChanged) -> None:
        if self.report_states:
            self.listener(event)

    def _state(self, node: Node, state: Optional[dict]) -> None:
        if not state or state.get("state") not in ("succeeded", "failed", "stopped"):
            return
        self._report(NodeChanged(node.host.rank, node.host.label, NodeState(state["state"]),
                                  exit_code=state.get("exit_code"), time=time.time()))


def _mirror_names(directory: Path) -> List[str]:
    names = []
    if (directory / "launcher.log").is_file():
        names.append("launcher.log")
    log = directory / "log"
    if log.is_dir():
        names += [f"log/{p.name}" for p in sorted(log.iterdir())
                  if p.is_file() and not p.name.startswith(".")]
    return names


def _read_exact(stream, length: int) -> bytes:
    chunks, left = [], length
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("log stream ended inside a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


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
