"""Every run on a set of hosts, from every controller and user: read from each host's
registry (remote/registry/holds.py) and merged by run, in the order ``status --all`` lists
them (squeue's view of a cluster without a scheduler; the table is views/status_all_view.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .. import helper
from ..untrusted import clean_report
from ..remote.registry.holds import fold_ints

STATES = ("queued", "starting", "running", "succeeded", "failed", "stopped", "lost")
LIVE = ("queued", "starting", "running")
ENDED = ("succeeded", "failed", "stopped")
# How bad the news is, worst last: of a run's hosts the worst is its state (failed on one
# host and stopped on the others by the teardown: failed), and ended runs are listed
# worst first. Lost (the process gone, nothing recorded) is no better than failed.
WORST = ("queued", "starting", "running", "succeeded", "stopped", "failed", "lost")


@dataclass(frozen=True)
class SharedRun:
    """One run as the hosts' registries tell it."""

    run_id: str
    name: str
    user: str
    state: str                    # one of STATES
    hosts: Tuple[str, ...]        # the hosts (labels as given here) where it is recorded
    gpus: str                     # '0-7', '' for none
    since: float                  # when it was asked (queued) or prepared
    started: Optional[float]
    ended: Optional[float]
    exit_code: Optional[int]
    controller: str
    place: int = 0                # its place in the queue (1: next), for a queued run

    def duration(self, now: float) -> Optional[float]:
        began = self.started or (None if self.state == "queued" else self.since)
        if began is None:
            return None
        return (self.ended or now) - began

    def to_json(self, now: float) -> dict:
        data = asdict(self)
        data["hosts"] = list(self.hosts)
        data["duration"] = self.duration(now)
        return data


def state_of(entry: dict) -> Optional[str]:
    if entry.get("kind") == "queue":
        return "queued" if entry.get("live") else None
    if entry.get("state") in ("succeeded", "failed", "stopped"):
        return entry["state"]
    if not entry.get("live"):
        return "lost"
    return "running" if entry.get("pid") else "starting"


def queue_order(entries: Sequence[dict]) -> List[dict]:
    """Live queue entries in the one order every controller agrees on: by when each run
    asked, then by run id."""
    return sorted((e for e in entries if e.get("kind") == "queue" and e.get("live")),
                  key=lambda e: (e.get("time") or 0.0, e.get("run_id")))


def merge(per_host: Dict[str, List[dict]]) -> List[SharedRun]:
    """Entries of every host, one SharedRun per (user, run, kind): a run is on several
    hosts."""
    runs: Dict[Tuple[str, str, str], dict] = {}
    where: Dict[Tuple[str, str, str], List[str]] = {}
    for label, entries in per_host.items():
        for entry in entries:
            state = state_of(entry)
            if state is None:
                continue
            # Keyed by user too: another user's entry of the same run id is another run
            # (hers, or a forgery), never merged into this one.
            key = (entry.get("user") or "?", entry["run_id"], "queue" if state == "queued" else "run")
            where.setdefault(key, []).append(label)
            best = runs.get(key)
            # The worst news of any host: a run failed on one host failed.
            if best is None or WORST.index(state) > WORST.index(best["_state"]):
                runs[key] = dict(entry, _state=state)
    queued = queue_order([r for r in runs.values() if r["_state"] == "queued"])
    places = {(e.get("user"), e["run_id"]): i + 1 for i, e in enumerate(queued)}
    out = [SharedRun(e["run_id"], e.get("name") or "", e.get("user") or "?", e["_state"],
                     tuple(where[key]), fold_ints(e.get("gpus") or ()),
                     e.get("time") or 0.0, e.get("started"), e.get("ended"), e.get("exit_code"),
                     e.get("controller") or "", places.get((e.get("user"), e["run_id"]), 0)
                     if e["_state"] == "queued" else 0)
           for key, e in runs.items()]
    return sorted(out, key=order)


def order(run: SharedRun) -> tuple:
    """Live runs first (running before the line, the line in its order), then the ended
    ones, the worst news first, the newest first within each."""
    if run.state in LIVE:
        return (0, run.place or 0, -run.since)
    return (1, -WORST.index(run.state), -run.since)


def chosen(runs: Sequence[SharedRun], *, ended: bool = False, mine: Optional[str] = None,
           state: Optional[str] = None) -> List[SharedRun]:
    """What ``status --all`` lists: runs not ended (a lost one is news until looked at)
    unless ``ended``; with ``mine``, those started by that user of the controllers (not
    the hosts' account, which a team may share); one state with ``state``."""
    return [r for r in runs
            if (ended or state in ENDED or r.state not in ENDED)
            and (mine is None or r.controller.partition("@")[0] == mine)
            and (state is None or r.state == state)]


def registry_entries(reply: object) -> List[dict]:
    """A host's registry as it sent it (``hold.list``, ``hold.queue``): untrusted, so its
    text cleaned of escapes and only entries of the expected shape kept."""
    entries = clean_report(reply).get("entries") if isinstance(reply, dict) else None
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("run_id"), str)
            and e.get("kind") in ("run", "queue")] if isinstance(entries, list) else []


def gather(cluster) -> Tuple[List[SharedRun], list]:
    """Ask every host for its registry: (runs, the errors of hosts that did not answer)."""
    results = cluster.map(lambda host, transport: helper.call(transport, "hold.list", {},
                                                              timeout=30))
    per_host = {r.host.label: registry_entries(r.value) for r in results if r.ok}
    return merge(per_host), [r.error for r in results if not r.ok]


def nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
