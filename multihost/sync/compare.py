"""A sync's comparison by content and what follows it: each host's helper answers its
plan (what differs from the manifest), one workdir of one machine listed twice is
refused before a byte is sent, hosts already identical are closed, the others get what
differs (deliver.py); then each fully synced host's state is remembered for the next
sync's fast path (fastpath.py). The steps around it are pipeline.py's.
"""
from __future__ import annotations

import functools
import os
from typing import Dict, Optional, Tuple

from ..events import Listener, SyncPlanned
from ..fanout import HostGroup
from ..machines import refuse_repeats
from .deliver import deliver
from .fastpath import forget_record, save_record
from .model import (HostNeeds, HostSync, dry_result, failed_result, merge_result, needs_from_plan,
                    waited_note)
from .session import HostSession


def _same_tree(transport, code_root: str, remote_root: str) -> bool:
    """A host that is this machine with its workdir on the code directory: nothing to do."""
    return transport.is_local and os.path.realpath(remote_root) == os.path.realpath(code_root)


def compare_and_send(cluster: HostGroup, manifest, sessions: Dict[int, HostSession],
                     known: Dict[int, HostNeeds], results: Dict[int, HostSync], dry_run: bool,
                     emit: Listener, claims: Dict[int, dict], waits: Dict[int, str],
                     machines: Dict[int, Tuple[Optional[str], str]]
                     ) -> Dict[int, Dict[str, list]]:
    """Each session's plan, then what differs (with what ``known`` hosts need); fills
    ``results`` (and ``waits``: the hosts whose helper waited for another sync), returns
    the hosts' stat keys of what is in sync. One workdir of one machine listed twice
    (``machines``: the known hosts' identities and roots; the sessions say theirs) is
    refused before a byte is sent."""
    payload = functools.lru_cache(maxsize=1)(manifest.encode)  # only for hosts that compare
    needs: Dict[int, HostNeeds] = dict(known)
    labels = {h.rank: h.label for h in cluster.hosts}
    for rank, host_needs in known.items():
        emit(SyncPlanned(labels[rank], host_needs))
    planned_hosts = [h for h in cluster.hosts if h.rank in sessions]
    plans: Dict[int, dict] = {}
    for planned in cluster.map(lambda host, t: sessions[host.rank].plan(len(manifest.entries), payload), planned_hosts):
        host = planned.host
        if not planned.ok:
            results[host.rank] = failed_result(host.label, host.rank, planned.error)
            continue
        if planned.value.get("waited"):
            waits[host.rank] = waited_note(planned.value["waited"])
        if planned.value.get("gen") is not None and host.rank in claims:
            # The streams after this plan are applied only if no other sync wrote since.
            claims[host.rank] = dict(claims[host.rank], gen=planned.value["gen"])
        plans[host.rank] = planned.value
        host_needs = needs_from_plan(manifest, host.rank, planned.value)
        if _same_tree(cluster.transport(host), manifest.root, host_needs.root):
            results[host.rank] = HostSync(host.label, host.rank, host_needs.root,
                                          notes=("the workdir is the code directory itself",))
            continue
        needs[host.rank] = host_needs
        emit(SyncPlanned(host.label, host_needs))
    places = dict(machines)
    for rank, session in sessions.items():
        places[rank] = (session.machine, plans.get(rank, {}).get("root"))
    refuse_repeats(cluster.hosts, {rank: f"{machine}|{root}" if machine and machine != "-"
                                   and root else None for rank, (machine, root) in places.items()})
    busy = {} if dry_run else {rank: n for rank, n in needs.items() if not n.empty}
    for rank in needs.keys() - busy.keys():
        label = labels[rank]
        results[rank] = dry_result(label, needs[rank]) if dry_run else \
            merge_result(label, needs[rank], [], None, (), 0.0)
    # Already identical (or a dry run): end those sessions now; they answer their keys.
    idle = [h for h in cluster.hosts if h.rank in sessions and h.rank not in busy]
    keys: Dict[int, Dict[str, list]] = {}
    for closed in cluster.map(lambda host, t: sessions[host.rank].close(), idle):
        if closed.ok:
            keys[closed.host.rank] = closed.value.get(str(closed.host.rank), {}).get("keys") or {}
    if busy:
        delivered, more_keys = deliver(cluster, manifest, busy, sessions, emit, claims)
        results.update(delivered)
        keys.update(more_keys)
    return keys


def remember_synced(cluster: HostGroup, manifest, workdirs: Dict[int, str], code_root: str,
                    results: Dict[int, HostSync], keys: Dict[int, Dict[str, list]]) -> None:
    """Remember each fully synced host's state for the next sync's fast path (the hash
    of its `stat` answer is learned by that next check: see ``remember_check``)."""
    for host in cluster.hosts:
        if host.rank not in keys:
            continue
        result = results.get(host.rank)
        if result is not None and result.ok and not result.kept:
            save_record(host.label, workdirs[host.rank], code_root, result.root, manifest,
                        keys[host.rank])
        else:
            forget_record(host.label, workdirs[host.rank], code_root)
