"""A rank that died of its peer's death is not the root cause: the peer is.

When a rank crashes, its peers' collectives lose their connection to it (gloo: "Connection
closed by peer", NCCL: "remote process exited") and they fail too, sometimes before the
crashed rank's own exit is recorded: its process can take longer to end (torch's
teardown, a loaded machine). Naming the earliest exit would then blame the victim. So a
root cause whose last lines show such a loss gives way to another rank that failed
within PEER_SLACK seconds of it.

Each pattern is one record: what the collective library prints when its peer is gone.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence, Tuple

from .outcome import Failure, root_cause

PEER_GONE: Tuple["re.Pattern[str]", ...] = (
    re.compile(r"gloo/transport/tcp/pair\.cc:\d+\]? Connection closed by peer"),
    re.compile(r"gloo/transport/tcp/pair\.cc:\d+\]? .*Connection reset by peer"),
    re.compile(r"NCCL .*remote process exited or there was a network error"),
)
PEER_SLACK = 5.0   # seconds: a crashed process ends well within this, even when loaded
_RANKS = ("rank", "node", "server")


def died_of_a_peer(tail: Sequence[str]) -> bool:
    return any(pattern.search(line) for line in tail for pattern in PEER_GONE)


def peer_first(cause: Failure, tail: Sequence[str],
               failures: Sequence[Failure]) -> Optional[Failure]:
    """The failure to name instead of ``cause`` (whose last lines are ``tail``) when it
    died of a peer's death; None when it did not, or no other rank failed soon after."""
    if cause.kind not in _RANKS or not died_of_a_peer(tail):
        return None
    others = [f for f in failures if f.kind in _RANKS
              and (f.node_rank, f.local_rank, f.server) != (cause.node_rank, cause.local_rank,
                                                           cause.server)
              and 0 <= f.time - cause.time <= PEER_SLACK]
    return root_cause(others)
