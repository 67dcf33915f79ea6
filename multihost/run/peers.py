"""A rank that died of its peer's death is not the root cause: the peer is.

When a rank crashes, its peers' collectives lose their connection to it (gloo: "Connection
closed by peer", NCCL: "remote process exited") and they fail too, sometimes before the
crashed rank's own exit is recorded: its process can take longer to end (torch's
teardown, a loaded machine). Naming the earliest exit would then blame the victim. So a
root cause whose last lines show such a loss gives way to another rank that failed
within PEER_SLACK seconds of it.

The rank it gives way to must have failed of its own: not one ended by SIGTERM or SIGINT
(torchrun ends a failed rank's neighbours so, as multihost does the other nodes), and not
one whose own last lines show a lost peer. On a loaded machine the crashed rank's record
(os._exit leaves no exit mark, so it is dated by its wrapper) can come after both: a
neighbour torchrun ended, and a victim on the crashed rank's node. A root cause ended by
such a signal gives way the same way to a rank that failed of its own right after it.

Each pattern is one record: what the collective library prints when its peer is gone.
"""
from __future__ import annotations

import re
from typing import Callable, Optional, Sequence, Tuple

from .outcome import Failure, by_time, ended_by_a_stop

PEER_GONE: Tuple["re.Pattern[str]", ...] = (
    re.compile(r"gloo/transport/tcp/pair\.cc:\d+\]? Connection closed by peer"),
    re.compile(r"gloo/transport/tcp/pair\.cc:\d+\]? .*Connection reset by peer"),
    re.compile(r"NCCL .*remote process exited or there was a network error"),
)
PEER_SLACK = 5.0   # seconds: a crashed process ends well within this, even when loaded
LOOKS = 8          # failures whose last lines are read (a host asked each) to find it
_RANKS = ("rank", "node", "server")

# A failure as the host explains it: the rank its launcher named, and its last lines.
Explain = Callable[[Failure], Tuple[Failure, Sequence[str]]]


def died_of_a_peer(tail: Sequence[str]) -> bool:
    return any(pattern.search(line) for line in tail for pattern in PEER_GONE)


def peer_first(cause: Failure, tail: Sequence[str], failures: Sequence[Failure],
               explain: Optional[Explain] = None) -> Optional[Failure]:
    """The failure to name instead of ``cause`` (whose last lines are ``tail``) when it
    died of a peer's death or was ended by a stop signal: the earliest other rank that
    failed of its own within PEER_SLACK after it. ``explain`` tells another failure's
    last lines (without it, every other failure counts as its own). None when ``cause``
    stays: it failed of its own, or nothing else did soon after."""
    if cause.kind not in _RANKS or not (died_of_a_peer(tail) or ended_by_a_stop(cause)):
        return None
    others = sorted((f for f in failures if f.kind in _RANKS and not ended_by_a_stop(f)
                     and (f.node_rank, f.local_rank, f.server) != (cause.node_rank,
                                                                  cause.local_rank, cause.server)
                     and 0 <= f.time - cause.time <= PEER_SLACK), key=by_time)
    for other in others[:LOOKS]:
        if explain is None:
            return other
        told, last = explain(other)
        if not ended_by_a_stop(told) and not died_of_a_peer(last):
            return other
    return None   # every other one died of a peer too: none is more to blame
