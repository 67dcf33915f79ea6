"""The controller's side of a relay chain (the hosts' side: remote/sync_relay.py).

Every host of the chain gets its node at once, over the controller's own open
connection: the head reads the stream from the controller, every other node listens on
its rendezvous for the one before it. So a chain of 64 hosts is set up in about the time
of one host-to-host handshake, not 64 one after the other. Each node answers here over
its own channel; the answers are merged with what a node said about the hosts it had to
go around (``merge_answers``).
"""
from __future__ import annotations

import secrets
import threading
from typing import Callable, Dict, List, Optional, Sequence

from .. import helper
from ..errors import MultihostError
from .transfer import close_process

# How many hosts a node may go around (each unreachable) before the chain is cut there
# and every host after it gets its files from the controller. Bounds each request's size.
SKIP_AHEAD = 4
NODE_WAIT = 1800.0  # a node's answer, after it has everything (its own waits are bounded)


def chain_requests(ranks: Sequence[int], hops: Sequence[dict], roots: Dict[int, str],
                   token: str) -> List[dict]:
    """The sync.receive request of each node of the chain, head first."""
    requests = []
    for index, rank in enumerate(ranks):
        spec = {"token": token, "next": list(hops[index + 1:index + 1 + SKIP_AHEAD])}
        if index:
            spec["listen"] = True
        requests.append({"root": roots[rank], "rank": rank, "keys": True, "relay": spec})
    return requests


def merge_answers(ranks: Sequence[int], answers: Sequence[dict]) -> Dict[str, dict]:
    """Each host's result: its own node's answer when it got everything; else the cause
    a node before it gave (why the chain went around it, or broke off there), else its
    own error. What a node says of another host counts only as an error: no host can
    declare another one synced."""
    merged: Dict[str, dict] = {}
    for index, rank in enumerate(ranks):
        key = str(rank)
        own = answers[index].get(key) if isinstance(answers[index], dict) else None
        if isinstance(own, dict) and not own.get("error"):
            merged[key] = own
            continue
        cause = None
        for earlier in answers[:index]:
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
    answer (a ``nodes`` dict)."""

    def __init__(self, transports: Sequence[object], labels: Sequence[str], ranks: Sequence[int],
                 hops: Sequence[dict], roots: Dict[int, str],
                 register: Callable[[object], None]):
        self.transports = transports
        self.labels = labels
        self.ranks = list(ranks)
        self.requests = chain_requests(ranks, hops, roots, secrets.token_hex(16))
        self.register = register
        self.answers: List[dict] = [{} for _ in ranks]
        self.answered = [threading.Event() for _ in ranks]

    def run(self, head_stream: Callable[[dict], dict]) -> Dict[str, dict]:
        threads = [threading.Thread(target=self._node, args=(index,), daemon=True)
                   for index in range(1, len(self.ranks))]
        for thread in threads:
            thread.start()
        try:
            self.answers[0] = head_stream(self.requests[0])
        finally:
            self.answered[0].set()
            for thread in threads:
                thread.join()
        return merge_answers(self.ranks, self.answers)

    def _node(self, index: int) -> None:
        transport = self.transports[index]
        key = str(self.ranks[index])
        process = None
        try:
            process = helper.launch(transport, "sync.receive", self.requests[index])
            self.register(process)
            # A node nobody connected to gives up when its stdin ends: once every node
            # before it has answered, whatever it will ever get has been sent to it.
            for before in self.answered[:index]:
                before.wait()
            process.stdin.close()
            out = process.stdout.read()
            err = process.read_stderr()
            code = process.wait(NODE_WAIT)
            result = helper.parse_reply(transport, "sync.receive", code, out, err)
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
