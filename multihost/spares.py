"""Spare hosts: machines held back from the job's world, each ready to take the node rank
of a host that fails the preflight or is lost during a run.

Pure inventory logic, stdlib only: reading ``--spares`` and the hostfile's ``spare =
true``, choosing the next spare, and the host list after a replacement. A spare is never
part of the world: the job's hosts keep the order (and so the node ranks) the user gave;
a spare that takes node k becomes host k, with k's ranks, and as node 0 it hosts the
rendezvous (MASTER_ADDR is node 0's address in every plan).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .errors import ConfigError
from .hosts import Host

def parse_spares(text: str) -> List[Dict[str, object]]:
    """``--spares`` into one dict of fields per spare, like ``--ips`` (``[user@]host[:port]``),
    with node sets (``gpu[5-6]``) expanded in the order written."""
    from .host_parsing import parse_host_item
    from .nodeset import expand

    if not text.strip():
        raise ConfigError("--spares is empty", fix="name spare hosts, e.g. --spares 10.0.0.5,10.0.0.6")
    entries = []
    for index, item in enumerate(expand(text, "--spares"), start=1):
        name, user, port = parse_host_item(item, f"--spares item {index}")
        entries.append({"name": name, "user": user, "port": port,
                        "_where": f"--spares item {index}"})
    return entries


def spare_item(host: Host) -> str:
    """A spare as ``--spares`` names it (``[user@]host[:port]``): what a job file keeps."""
    return f"{host.user}@{host.label}" if host.user else host.label


def host_key(host: Host) -> Tuple[str, int]:
    return host.name.lower(), host.port or 22


def spare_pool(hosts: Sequence[Host], spares: Iterable[Host]) -> Tuple[Host, ...]:
    """The spares that are not already one of the job's hosts (a `rerun` of a run whose
    spare took a rank lists it among the hosts), each once, in the order given."""
    taken = {host_key(h) for h in hosts}
    pool: List[Host] = []
    for spare in spares:
        if host_key(spare) not in taken:
            taken.add(host_key(spare))
            pool.append(spare)
    return tuple(pool)


@dataclass(frozen=True)
class Replacement:
    """One spare taking one node rank: what `status`, the views and the record say."""

    attempt: int        # the attempt that starts with the spare (0 is the first)
    node_rank: int
    host: str           # the label of the host that left
    spare: str          # the label of the spare that took its place
    why: str            # "lost" (during a run) or "check" (failed the preflight)

    @property
    def line(self) -> str:
        return f"{self.host} replaced by spare {self.spare} (node {self.node_rank})"

    def to_json(self) -> Dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Dict[str, object]) -> "Replacement":
        return cls(int(data.get("attempt") or 0), int(data.get("node_rank") or 0),  # type: ignore[arg-type]
                   str(data.get("host", "?")), str(data.get("spare", "?")),
                   str(data.get("why", "")))


def take_rank(spare: Host, leaving: Host) -> Host:
    """The spare as host ``leaving.rank``: the node rank (so the same global ranks), and
    the leaving host's devices and process count where the spare's own entry says none,
    so the world keeps its size and shape."""
    return dataclasses.replace(
        spare, rank=leaving.rank,
        gpus=spare.gpus if spare.gpus is not None else leaving.gpus,
        slots=spare.slots if spare.slots is not None else leaving.slots)


def replace_node(hosts: Sequence[Host], node_rank: int, spare: Host) -> Tuple[Host, ...]:
    """The job's hosts with node ``node_rank`` held by ``spare``; every other host keeps
    its place."""
    if not 0 <= node_rank < len(hosts):
        raise ValueError(f"node {node_rank} is not one of {len(hosts)} nodes")
    out = list(hosts)
    out[node_rank] = take_rank(spare, hosts[node_rank])
    return tuple(out)


@dataclass(frozen=True)
class SpareState:
    """The spares still unused, in order, and the replacements made so far."""

    pool: Tuple[Host, ...]
    replacements: Tuple[Replacement, ...] = ()

    def replace(self, hosts: Sequence[Host], node_rank: int, attempt: int,
                why: str) -> Optional[Tuple[Tuple[Host, ...], "SpareState"]]:
        """The hosts with the next spare on ``node_rank``, and what is left; None when no
        spare is left."""
        if not self.pool:
            return None
        spare, rest = self.pool[0], self.pool[1:]
        leaving = hosts[node_rank].label
        kept = []
        for earlier in self.replacements:
            # A spare that failed in turn, before its attempt started: the story is the
            # first host replaced by the spare that finally holds its rank.
            if (earlier.attempt, earlier.node_rank, earlier.spare) == (attempt, node_rank, leaving):
                leaving, why = earlier.host, earlier.why
            else:
                kept.append(earlier)
        change = Replacement(attempt, node_rank, leaving, spare.label, why)
        return (replace_node(hosts, node_rank, spare),
                SpareState(rest, tuple(kept) + (change,)))

    def drop(self, labels: Iterable[str]) -> "SpareState":
        """Without the spares known to be unusable (their own preflight failed)."""
        gone = set(labels)
        return dataclasses.replace(self, pool=tuple(h for h in self.pool if h.label not in gone))

