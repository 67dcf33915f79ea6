"""Moving bytes to the hosts: one stream per host, and relays host to host.

Every host gets one ``sync.receive`` stream from the controller with its deletions,
directories, links, mode changes and the files only it needs. Files that several hosts
need and that weigh enough travel once: the controller sends them to the first of those
hosts, which forwards them to the next as it writes them (``remote/sync/relay.py``),
so the controller's uplink carries them once instead of once per host. A host the
relay could not reach, or a file the relay could not deliver, is then sent directly.
"""
from __future__ import annotations

import json
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .. import helper
from ..errors import ConnectError, MultihostError, RemoteError
from ..events import Listener, SyncProgress
from ..hosts import Host
from ..remote.sync.fs import FILE, LINK
from ..remote.sync.wire import Writer
from .manifest import Entry
from ..transport.base import BrokenStream, pipe_errors_raise  # noqa: F401 (its old home)
from ..transport.openssh import known_hosts_name, ssh_base

# A group of files goes through a relay when at least two hosts need it and it weighs
# this much: below, the relay's extra ssh hops cost more than they save.
RELAY_MIN_BYTES = 16 * 1024 * 1024
# AES-GCM first: several times faster than OpenSSH's default chacha20 where the CPU has AES.
HOP_CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
               "aes128-ctr,aes256-ctr")
SEND_BUFFER = 256 * 1024


class ProgressBoard:
    """Counters per host, updated from sending threads; emits throttled SyncProgress."""

    INTERVAL = 0.1

    def __init__(self, hosts: Dict[int, str], totals: Dict[int, Tuple[int, int]],
                 emit: Listener):
        self._labels = hosts
        self._totals = totals
        self._done = {rank: [0, 0] for rank in hosts}
        self._last = {rank: 0.0 for rank in hosts}
        self._emit = emit
        self._lock = threading.Lock()

    def add(self, ranks: Iterable[int], files: int = 0, count: int = 0, force: bool = False) -> None:
        events = []
        now = time.monotonic()
        with self._lock:
            for rank in ranks:
                done = self._done[rank]
                done[0] += files
                done[1] += count
                if force or now - self._last[rank] >= self.INTERVAL:
                    self._last[rank] = now
                    total = self._totals.get(rank, (0, 0))
                    events.append(SyncProgress(self._labels[rank], rank, done[0], total[0],
                                               done[1], total[1]))
        for event in events:
            self._emit(event)


class SendBuffer:
    """Buffers small writes (record headers, small files) into large channel writes."""

    def __init__(self, stream):
        self.stream = stream
        self.buffer = bytearray()

    def write(self, data) -> None:
        if len(data) >= SEND_BUFFER:
            self.flush()
            self.stream.write(data)
            return
        self.buffer += data
        if len(self.buffer) >= SEND_BUFFER:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.stream.write(bytes(self.buffer))
            self.buffer = bytearray()
        self.stream.flush()


def close_process(process) -> None:
    """Close a remote command we are done with, quietly (closing flushes what we had
    written; to a helper that is gone, that fails), and drop its stream objects while
    everything they need is alive: left to the garbage collector they are finalized at
    exit, where paramiko's files print "Exception ignored" noise."""
    try:
        process.close()
    except Exception:
        pass
    for name in ("stdin", "stdout"):
        if hasattr(process, name):
            setattr(process, name, None)


def file_header(entry: Entry) -> dict:
    return {"t": FILE, "p": entry.path, "s": entry.size, "m": entry.mode, "mt": entry.mtime_ns,
            "h": entry.value}


def write_entries(writer: Writer, root: str, entries: Sequence[Entry],
                  on_bytes: Callable[[int], None], on_file: Callable[[], None]) -> List[Tuple[str, str]]:
    """File and link records; returns the files that could not be read here."""
    unreadable = []
    for entry in entries:
        if entry.kind == LINK:
            writer.record({"t": LINK, "p": entry.path, "to": entry.value})
        else:
            try:
                writer.file(file_header(entry), f"{root}/{entry.path}", on_bytes)
            except OSError as exc:
                unreadable.append((entry.path, exc.strerror or str(exc)))
                continue
        on_file()
    return unreadable


def stop_process(process) -> None:
    """End a stream at once: kill a local `ssh` we started, close a remote command's channel."""
    kill = getattr(process, "kill", None)
    if kill is not None:
        try:
            kill()
        except OSError:
            pass
    else:
        close_process(process)


def stream_to(transport, request: dict, fill: Callable[[Writer], None], timeout: float = 600,
              register: Optional[Callable[[object], None]] = None) -> dict:
    """Start ``sync.receive`` on a host, write the stream with ``fill``, return its reply
    (the ``nodes`` dict). A broken connection is a ConnectError naming the host.

    The helper is started without asking first whether it is there (one round trip
    less): if it is not, the host answers 97 at once, it is installed, and the stream
    is written again."""
    label = transport.host.label
    for attempt in (1, 2):
        process = helper.launch(transport, "sync.receive", request)
        if register is not None:
            register(process)
        sink = SendBuffer(process.stdin)
        broken: Optional[BrokenStream] = None
        try:
            writer = Writer(sink)
            fill(writer)
            writer.end()
            sink.flush()
            process.stdin.close()
        except MultihostError:
            close_process(process)
            raise
        except BrokenStream as exc:
            broken = exc
        out = process.stdout.read() if broken is None else b""
        err = process.read_stderr()
        try:
            code = process.wait(timeout if broken is None else 30)
        except MultihostError:
            code = None
        # One that ended before reading its stream said why (a busy workdir, say).
        refused = _refusal(process) if broken is not None and code not in (None, 0) else None
        close_process(process)
        if code == helper.MISSING and attempt == 1:
            helper.install(transport)
            continue
        if refused is not None:
            helper.parse_reply(transport, "sync.receive", code, refused, err)
        if broken is not None:
            raise ConnectError(f"the connection broke while sending files ({broken})", host=label,
                               kind=ConnectError.LOST,
                               fix="check the host and the network, then sync again: it resumes")
        result = helper.parse_reply(transport, "sync.receive", code, out, err)
        nodes = result.get("nodes") if isinstance(result, dict) else None
        if not isinstance(nodes, dict):
            raise RemoteError("the host's sync.receive reply has no results", host=label,
                              fix="run the sync again")
        return nodes
    raise RemoteError("the sync helper would not start", host=label,
                      fix="run `multihost check` on this host")


def _refusal(process) -> Optional[bytes]:
    """The reply of a helper that ended before reading its stream, if it gave one."""
    try:
        out = process.stdout.read()
    except Exception:  # the channel is gone: nothing more to learn from it
        return None
    return out if b'"ok":false' in out else None


def hop_spec(host: Host, transport, root: str, op: str = "sync.receive") -> dict:
    """How a host reaches ``host`` with its own ssh: the address, port and user the
    controller itself connected to (an alias of the controller's ssh config means
    nothing on the hosts)."""
    target = getattr(transport, "target", None)
    name = getattr(target, "hostname", None) or host.name
    port = getattr(target, "port", None) or host.port
    user = getattr(target, "user", None) or host.user
    # The hosts' own known_hosts decide, strictly: a relay that cannot check its next
    # host's key fails and the controller sends to that host itself.
    ssh = ssh_base(10, accept_new=False, key_name=known_hosts_name(name, port or 22)) + [
        "-o", "Compression=no", "-c", HOP_CIPHERS]
    if port and int(port) != 22:
        ssh += ["-p", str(port)]
    if user:
        ssh += ["-l", user]
    ssh += ["--", name]
    return {"rank": host.rank, "name": host.label, "ssh": ssh, "line": hop_line(host, op),
            "root": root}


class _HostOnly:
    def __init__(self, host: Host):
        self.host = host


def hop_line(host: Host, op: str = "sync.receive") -> str:
    """The shell line that starts ``op`` on ``host`` (a receiver, or a relay's join),
    without its request: the relay appends that (quoted) as the last word. Made by
    helper_command itself, so it always runs the helper the way every other call does."""
    line = helper.helper_command(_HostOnly(host), op, {})
    empty = " " + shlex.quote("{}")
    if not line.endswith(empty):
        raise AssertionError("helper_command no longer ends with its request")
    return line[: -len(empty)]


@dataclass(frozen=True)
class RelayGroup:
    ranks: Tuple[int, ...]          # in node-rank order; the first is the head
    entries: Tuple[Entry, ...]

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries)


def group_for_relay(candidates: Dict[int, Sequence[Entry]], relayable: Iterable[int],
                    min_bytes: int = RELAY_MIN_BYTES) -> Tuple[List[RelayGroup], Dict[int, List[Entry]]]:
    """Split the files each host needs into relay groups (files needed by the same two or
    more hosts, heavy enough) and what goes directly. ``relayable``: the hosts a relay
    may include (reachable by ssh from the others: not this machine)."""
    relayable = set(relayable)
    needed_by: Dict[str, List[int]] = {}
    by_path: Dict[str, Entry] = {}
    for rank in sorted(candidates):
        for entry in candidates[rank]:
            if entry.kind == FILE and rank in relayable:
                needed_by.setdefault(entry.path, []).append(rank)
                by_path[entry.path] = entry
    groups: Dict[Tuple[int, ...], List[Entry]] = {}
    for path, ranks in needed_by.items():
        if len(ranks) >= 2:
            groups.setdefault(tuple(ranks), []).append(by_path[path])
    relays = [RelayGroup(ranks, tuple(entries)) for ranks, entries in groups.items()
              if sum(e.size for e in entries) >= min_bytes]
    relayed = {(rank, e.path) for group in relays for rank in group.ranks for e in group.entries}
    direct = {rank: [e for e in entries if (rank, e.path) not in relayed]
              for rank, entries in candidates.items()}
    return sorted(relays, key=lambda g: g.ranks), direct


def call_streaming(transport, op: str, request: dict, payload: bytes,
                   on_progress: Callable[[object], None], timeout: Optional[float] = None):
    """Run a streaming helper operation that prints ``{"progress": ...}`` lines while it
    works and its reply last; returns the reply's result (helper.parse_reply)."""
    process = helper.start(transport, op, request)
    try:
        process.stdin.write(payload)
        process.stdin.flush()
        process.stdin.close()
    except BrokenStream as exc:
        close_process(process)
        raise ConnectError(f"the connection broke while starting {op} ({exc})",
                           host=transport.host.label, kind=ConnectError.LOST,
                           fix="check the host and the network") from None
    lines: List[bytes] = []
    for raw in process.stdout:
        if raw.startswith(b'{"progress"'):
            try:
                on_progress(json.loads(raw)["progress"])
            except ValueError:
                pass
            continue
        lines.append(raw)
    err = process.read_stderr()
    code = process.wait(timeout)
    close_process(process)
    return helper.parse_reply(transport, op, code, b"".join(lines), err)
