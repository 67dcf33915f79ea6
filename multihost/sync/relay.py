"""The controller's side of a relay chain (the hosts' side: remote/sync/relay.py).

Every host of the chain gets its node at once, over the controller's own open
connection: the head reads the stream from the controller, every other node listens on
its rendezvous for the one before it. A host whose ``sync.session`` is still open (it
made the host's plan, and the relay brings all the host gets) is handed its node's
request there (``sessions``): the session is the node, and no ``sync.receive`` starts.
So a chain of 64 hosts is set up in about the time of one host-to-host handshake, not
64 one after the other. Each node answers here over
its own channel; the answers are merged with what a node said about the hosts it had to
go around (``merge_answers``).

The same chain carries ``--sync-data``'s push (``fed``): there the stream comes from the
first host, not from the controller, so every node listens, the head too, and the first
host's ``sync.push`` reaches the head with ``ssh HEAD sync.join`` (going around a head it
cannot reach, as any node does).
"""
from __future__ import annotations

import json
import secrets
import threading
from typing import Callable, Dict, List, Optional, Sequence

from .. import helper, waits
from ..errors import MultihostError
from .transfer import close_process, stop_process

# How many hosts a node may go around (each unreachable) before the chain is cut there
# and every host after it gets its files from the controller. Bounds each request's size.
SKIP_AHEAD = 4
NODE_WAIT = 1800.0  # a node's answer, after it has everything (its own waits are bounded)


def chain_requests(ranks: Sequence[int], hops: Sequence[dict], roots: Dict[int, str],
                   token: str, fed: bool = False, keys: bool = True,
                   claims: Optional[Dict[int, dict]] = None) -> List[dict]:
    """The sync.receive request of each node of the chain, head first. ``fed``: the
    head too listens, for a feeder outside the chain (``feeder_spec``); ``keys``: each
    node answers the stat keys of what it wrote (a code sync records them); ``claims``:
    what a node shows its workdir's lock, and its part of the sync (remote/sync/lock)."""
    requests = []
    for index, rank in enumerate(ranks):
        spec = {"token": token, "next": list(hops[index + 1:index + 1 + SKIP_AHEAD])}
        if index or fed:
            spec.update(listen=True, idle=waits.relay_idle())
        request = {"root": roots[rank], "rank": rank, "keys": keys, "relay": spec}
        claim = (claims or {}).get(rank)
        if claim is not None:
            request.update(claim=claim, part=claim.get("part"))
            if index:  # the head's progress is what the controller sends it
                spec["progress"] = True
        requests.append(request)
    return requests


def feeder_spec(hops: Sequence[dict], token: str) -> dict:
    """The relay spec of a feeder: a node of its own that only sends, to the head (or
    the first of the hops after it that it can reach)."""
    return {"token": token, "next": list(hops[:SKIP_AHEAD])}


def merge_answers(ranks: Sequence[int], answers: Sequence[dict],
                  fed: Optional[dict] = None) -> Dict[str, dict]:
    """Each host's result: its own node's answer when it got everything; else the cause
    a node before it gave (why the chain went around it, or broke off there; ``fed``: the
    feeder's answer, before the head), else its own error. What a node says of another
    host counts only as an error: no host can declare another one synced."""
    merged: Dict[str, dict] = {}
    before = [fed] if fed is not None else []
    for index, rank in enumerate(ranks):
        key = str(rank)
        own = answers[index].get(key) if isinstance(answers[index], dict) else None
        if isinstance(own, dict) and not own.get("error"):
            merged[key] = own
            continue
        cause = None
        for earlier in before + list(answers[:index]):
            said = earlier.get(key) if isinstance(earlier, dict) else None
            if isinstance(said, dict) and said.get("error"):
                cause = said["error"]
        if cause is None and isinstance(own, dict):
            cause = own.get("error")
        merged[key] = {"error": str(cause or "no answer from the relay"), "relay": True}
    return merged


class Chain:
    """One relay chain: its nodes started and answered; ``run`` returns the merged
    answers. ``head_stream(request)`` sends the stream to the head and returns its
    answer (a ``nodes`` dict). ``fed``: the stream comes from outside the chain (the
    first host of ``--sync-data``): every node, the head too, is started here and
    listens, and ``head_stream(spec)`` gets the feeder's relay spec instead and returns
    the feeder's answer (what it says of the hosts it went around)."""

    def __init__(self, transports: Sequence[object], labels: Sequence[str], ranks: Sequence[int],
                 hops: Sequence[dict], roots: Dict[int, str],
                 register: Callable[[object], None], fed: bool = False, keys: bool = True,
                 sessions: Optional[Dict[int, object]] = None,
                 claims: Optional[Dict[int, dict]] = None,
                 on_progress: Optional[Callable[[int, int, int], None]] = None,
                 op: str = "sync.receive"):
        """``sessions``: by index in the chain (never the head's, which reads the
        controller's stream), the open HostSession that becomes that host's node.
        ``op``: what each node runs (``image.load`` carries an image the same way)."""
        self.op = op
        self.transports = transports
        self.sessions = dict(sessions or {})
        self.labels = labels
        self.ranks = list(ranks)
        token = secrets.token_hex(16)
        self.requests = chain_requests(ranks, hops, roots, token, fed, keys, claims)
        self.feeder = feeder_spec(hops, token) if fed else None
        self.register = register
        self.on_progress = on_progress   # (rank, files, bytes) a node says it has written
        self.answers: List[dict] = [{} for _ in ranks]
        self.answered = [threading.Event() for _ in ranks]
        self.fed_done = threading.Event()  # the feeder has answered (at once when none)
        if not fed:
            self.fed_done.set()
        self.lock = threading.Lock()
        self.started: List[object] = []

    def run(self, head_stream: Callable[[dict], dict]) -> Dict[str, dict]:
        first = 0 if self.feeder is not None else 1
        threads = [threading.Thread(target=self._node, args=(index,), daemon=True)
                   for index in range(first, len(self.ranks))]
        for thread in threads:
            thread.start()
        fed = None
        try:
            if self.feeder is not None:
                fed = head_stream(self.feeder)
            else:
                self.answers[0] = head_stream(self.requests[0])
        except BaseException:
            self._stop_nodes()  # Ctrl-C or a bug: no node waits for a stream to come
            raise
        finally:
            self.fed_done.set()
            if first:
                self.answered[0].set()
            for thread in threads:
                thread.join()
        return merge_answers(self.ranks, self.answers, fed)

    def _read(self, process, rank: int, lines: List[bytes]) -> None:
        """A node's output as it comes: its progress lines go to ``on_progress`` (what
        it has written, so a host cut off is never shown more than it holds)."""
        try:
            for line in iter(process.stdout.readline, b""):
                if line.startswith(b'{"progress"') and self.on_progress is not None:
                    try:
                        files, count = json.loads(line)["progress"]
                        self.on_progress(rank, int(files), int(count))
                    except (ValueError, KeyError, TypeError):
                        lines.append(line)
                    continue
                lines.append(line)
        except Exception:  # a channel torn down under us: its status says why
            pass

    def _stop_nodes(self) -> None:
        with self.lock:
            for process in self.started:
                stop_process(process)

    def _node(self, index: int) -> None:
        transport = self.transports[index]
        key = str(self.ranks[index])
        process = None
        session = self.sessions.get(index)
        op = "sync.session" if session is not None else self.op
        try:
            if session is not None:
                process = session.become_node(self.requests[index])
            else:
                process = helper.launch(transport, op, self.requests[index])
            with self.lock:
                self.started.append(process)
            self.register(process)
            lines: List[bytes] = []
            reader = threading.Thread(target=self._read, args=(process, self.ranks[index], lines),
                                      daemon=True)
            reader.start()
            # A node nobody connected to gives up when its stdin ends: once the feeder
            # and every node before it have answered, whatever it will ever get has
            # been sent to it.
            self.fed_done.wait()
            for before in self.answered[:index]:
                before.wait()
            process.stdin.close()
            reader.join()
            out = b"".join(lines)
            err = process.read_stderr()
            code = process.wait(NODE_WAIT)
            result = helper.parse_reply(transport, op, code, out, err)
            nodes = result.get("nodes") if isinstance(result, dict) else None
            self.answers[index] = nodes if isinstance(nodes, dict) else {
                key: {"error": f"{self.labels[index]}: its relay node gave no results"}}
        except MultihostError as error:
            self.answers[index] = {key: {"error": f"relay node on {self.labels[index]} failed: "
                                                  f"{error.cause}"}}
        except Exception as error:  # a channel torn down under us (a stop, a lost host)
            self.answers[index] = {key: {"error": f"relay node on {self.labels[index]} failed: "
                                                  f"{error}"}}
        finally:
            if process is not None:
                close_process(process)
            self.answered[index].set()


def head_failure(ranks: Sequence[int], head_label: str, cause: str) -> Dict[str, dict]:
    """The head's answer when its stream failed: every host is not reached through it."""
    return {str(rank): {"error": f"relay via {head_label} failed: {cause}"} for rank in ranks}
