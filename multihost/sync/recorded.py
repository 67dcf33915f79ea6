"""Before a sync of two or more hosts asks which of them share a workdir: each host with
a record is checked against it (fastpath.py: one `stat`) while the code is hashed here.

Which hosts share a workdir matters only to a sync that writes: if every host is as its
last sync left it and the code did not change, nothing is written, and the sync is that
one `stat` per host, with no shared-directory probe and no tokens to remove. Otherwise
the probe runs (shared.py), and the answers found here are kept for the sync itself, so
that no host is asked twice.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import Dict, Tuple, Union

from ..errors import MultihostError
from ..fanout import fan_out
from .fastpath import host_unchanged, load_record, matches_manifest, record_path
from .manifest import Manifest, build_manifest, code_root

# Per rank: the host's record, its keys just found unchanged (with the generation and
# machine its answer gave); False: asked, and it is not as recorded.
Looked = Dict[int, Union[dict, bool]]


def look_first(cluster, code_dir: str, workdirs: Dict[int, str], through_master: float,
               verify: bool = False) -> Tuple[Looked, "Future[Manifest]"]:
    """Each host's record checked by `stat` (hosts without one are not asked), while the
    manifest is built here in the background: what was found, and the manifest to come
    (waited for only by what needs it: a sync that writes starts its first host without
    it, as a sync of one host does). A host that cannot be reached is left out: the
    sync reports it. A code directory that is not one is refused here, before any host
    is asked anything."""
    root = code_root(code_dir)
    looked: Looked = {}

    def look(host):
        record = load_record(host.label, workdirs[host.rank], root)
        if record is None:
            return
        quick = cluster.reused(host)
        try:
            if quick is not None:
                looked[host.rank] = record if host_unchanged(quick, record, through_master) \
                    else False
                return
        except MultihostError:
            pass   # the master went away half-way: ask the host the ordinary way
        looked[host.rank] = record if host_unchanged(cluster.transport(host), record) else False

    manifest: "Future[Manifest]" = Future()

    def build() -> None:
        try:
            manifest.set_result(build_manifest(code_dir, verify=verify))
        except BaseException as err:  # handed to whoever waits for it
            manifest.set_exception(err)

    threading.Thread(target=build, daemon=True).start()
    # compared by content otherwise, whatever the records say; a host without a record
    # file is not given a thread (at 64 hosts, new workdirs: 64 threads for nothing)
    recorded = [] if verify else [h for h in cluster.hosts if os.path.exists(
        record_path(h.label, workdirs[h.rank], root))]
    if recorded:
        fan_out(recorded, look, cluster.workers)
    return looked, manifest


def nothing_to_write(cluster, looked: Looked, manifest: "Future[Manifest]") -> bool:
    """Every host is as recorded, and every record is of this very manifest (waited for
    only when every host is)."""
    return all(isinstance(looked.get(h.rank), dict) for h in cluster.hosts) and all(
        matches_manifest(looked[h.rank], manifest.result()) for h in cluster.hosts)
