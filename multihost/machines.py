"""One machine listed twice is refused by every command, by one function.

`--ips 198.18.0.11,h1` names one machine twice when h1 is 198.18.0.11: `exec` would run
the command on it twice and `sync` would write its workdir from two streams at once. Two
entries are one machine when they reach the same address and port, or when the machine
itself says so: the kernel's boot id and the network namespace (containers on one
kernel are separate hosts, with their own ports; see remote/machine.machine_identity,
which `check`, `run` and a sync's helper tell).
"""
from __future__ import annotations

import socket
from typing import Dict, Iterable, Mapping, Optional, Sequence

from .errors import ConfigError, and_more

# The same pair remote/machine.machine_identity gives, from a shell: `read` is the
# shell's own, so one process (readlink) besides the shell.
IDENTITY_SHELL = ("{ { read -r b < /proc/sys/kernel/random/boot_id && "
                  "n=$(readlink /proc/self/ns/net) && m=\"$b/$n\"; } 2>/dev/null || m=-; }")


def repeats(identities: Mapping[int, Optional[str]]) -> Dict[int, int]:
    """{rank: the first rank with the same identity} for every later entry that reaches
    a machine already listed; an unknown identity (None, '-', '') matches nothing."""
    first: Dict[str, int] = {}
    found: Dict[int, int] = {}
    for rank in sorted(identities):
        identity = identities[rank]
        if not identity or identity == "-":
            continue
        if identity in first:
            found[rank] = first[identity]
        else:
            first[identity] = rank
    return found


def refuse_repeats(hosts: Sequence, identities: Mapping[int, Optional[str]]) -> None:
    """A ConfigError naming the first entry that repeats a machine, with the fix."""
    found = repeats(identities)
    if not found:
        return
    by_rank = {host.rank: host for host in hosts}
    rank = min(found)
    later, first = by_rank[rank], by_rank[found[rank]]
    more = and_more([f"{by_rank[r].label} is {by_rank[found[r]].label}"
                     for r in sorted(found) if r != rank])
    raise ConfigError(f"{later.label} is the same machine as {first.label} (rank {first.rank}): "
                      f"one kernel, one network stack{more}",
                      host=later.label,
                      fix=f"list each machine once: add --exclude {later.label} (more "
                          "processes there: --nproc_per_node)")


def by_address(hosts: Iterable) -> Dict[int, Optional[str]]:
    """Each entry's address and port as the resolver gives them (an ssh alias that does
    not resolve here is unknown): entries sharing one are one machine, before any host
    is reached."""
    identities: Dict[int, Optional[str]] = {}
    for host in hosts:
        try:
            infos = socket.getaddrinfo(host.name, host.port or 22, 0, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            identities[host.rank] = None
            continue
        identities[host.rank] = min(f"{info[4][0]}:{info[4][1]}" for info in infos) \
            if infos else None
    return identities


def refuse_by_address(hosts: Sequence) -> None:
    refuse_repeats(hosts, by_address(hosts))


def identify(group) -> Dict[int, Optional[str]]:
    """Each host's boot id and network namespace, asked over its connection."""
    results = group.map(lambda host, t: t.run(IDENTITY_SHELL + '; printf "%s\\n" "$m"',
                                               timeout=30))
    return {r.host.rank: (r.value.stdout.decode("utf-8", "replace").strip() or None)
            if r.ok and r.value.exit_code == 0 else None for r in results}


def refuse_same_machine(group) -> None:
    """For a command about to act on every host of ``group`` (a HostGroup): refused when
    one machine is listed twice, by address first (no host reached), else as the
    machines say."""
    refuse_by_address(group.hosts)
    refuse_repeats(group.hosts, identify(group))
