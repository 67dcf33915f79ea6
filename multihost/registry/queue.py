"""``run --queue``: wait in line for hosts another run holds, then start as usual.

The waiting run writes a queue entry (a ticket: an id, when it asked, its GPUs) into the
registry of every host it needs (remote/registry/holds.py) and refreshes it every POLL seconds.
Its turn comes when, on every one of its hosts, no live run holds what it needs and no
queue entry that asked earlier wants the same GPUs. Every controller orders tickets the
same way (by when they asked, then by id), so runs with overlapping host sets never wait
for each other in a circle, and a wide run is never passed by later narrow ones.

A ticket is also kept in ~/.multihost/queue/<id>.json with the waiting controller's pid,
so `multihost stop NAME` from another shell takes it out of the line (SIGINT: the waiting
process leaves every host's queue, as on Ctrl-C).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from .. import helper
from ..errors import ConnectError, MultihostError
from ..nodeset import fold
from ..remote.registry.holds import holder_line, overlaps
from .holders import nth, registry_entries
from ..run.records import new_run_id, state_dir
from .entry import controller

POLL = 2.0


def tickets_dir():
    return state_dir() / "queue"


class Ticket:
    """One run's place in the line on its hosts, kept fresh until it leaves."""

    def __init__(self, cluster, name: str, gpus: Dict[str, Optional[List[int]]],
                 ports: Dict[str, List[int]]):
        self.cluster, self.name, self.gpus, self.ports = cluster, name, gpus, ports
        self.run_id = new_run_id()
        self.asked = time.time()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _request(self, host, leave=False) -> dict:
        return {"run_id": self.run_id, "leave": leave, "queue": {
            "name": self.name, "controller": controller(), "asked": self.asked,
            "gpus": self.gpus.get(host.label), "ports": self.ports.get(host.label) or [],
            "hosts": [h.label for h in self.cluster.hosts]}}

    def refresh(self) -> Dict[str, List[dict]]:
        """Write (or refresh) the entry on every host; every host's entries."""
        results = self.cluster.map(lambda host, t: helper.call(
            t, "hold.queue", self._request(host), timeout=30))
        failed = [r for r in results if not r.ok]
        if failed:
            raise failed[0].error
        return {r.host.label: registry_entries(r.value) for r in results}

    def blockers(self, entries: Dict[str, List[dict]]) -> List[Tuple[str, dict]]:
        """(host, entry) of what stands before this run, the holders first."""
        mine = (self.asked, self.run_id)
        held, ahead = [], []
        for label, found in entries.items():
            gpus, ports = self.gpus.get(label), self.ports.get(label) or []
            for e in found:
                if not e.get("live") or e.get("run_id") == self.run_id:
                    continue
                if e["kind"] == "run" and overlaps(e.get("gpus"), gpus, e.get("ports"), ports):
                    held.append((label, e))
                elif e["kind"] == "queue" and (e.get("time") or 0, e["run_id"]) < mine \
                        and overlaps(e.get("gpus"), gpus):
                    ahead.append((label, e))
        return held + ahead

    def place(self, blockers: List[Tuple[str, dict]]) -> Tuple[int, str, str]:
        """(place in line, the run first in the way, where): what a waiting user is told
        again when it changes; the holder's age in place_line is not news."""
        ahead = {e["run_id"] for _, e in blockers if e["kind"] == "queue"}
        first = blockers[0][1]
        where = fold([label for label, e in blockers if e["run_id"] == first["run_id"]])
        return len(ahead) + 1, first["run_id"], where

    def place_line(self, blockers: List[Tuple[str, dict]]) -> str:
        place, _, where = self.place(blockers)
        first = blockers[0][1]
        who = holder_line(first) if first["kind"] == "run" else \
            holder_line(first).replace(", no GPUs)", ")").replace(" (run ", " (queued, run ")
        return f"queued: {nth(place)}, behind {who} on {where}"

    def wait_turn(self, say: Callable[[str], None]) -> None:
        """Return when it is this run's turn; Ctrl-C (or `multihost stop`) leaves the line."""
        self._save()
        self._stop = threading.Event()
        said: Optional[Tuple[int, str, str]] = None
        restore = _terminate_leaves_the_line()
        try:
            while True:
                blockers = self.blockers(self.refresh())
                if not blockers:
                    say(f"queued run {self.name or self.run_id}: its turn, starting")
                    break
                if self.place(blockers) != said:
                    say(self.place_line(blockers))
                    said = self.place(blockers)
                time.sleep(POLL)
        except BaseException:
            self.leave()
            raise
        finally:
            restore()
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while not self._stop.wait(POLL):
            try:
                self.refresh()
            except (MultihostError, ConnectError):
                pass

    def leave(self) -> None:
        """Out of the line on every host (and of this controller's tickets)."""
        self._stop.set()
        self.cluster.map(lambda host, t: helper.call(t, "hold.queue",
                                                     self._request(host, leave=True), timeout=30))
        try:
            (tickets_dir() / f"{self.run_id}.json").unlink()
        except OSError:
            pass

    def _save(self) -> None:
        tickets_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
        (tickets_dir() / f"{self.run_id}.json").write_text(json.dumps(
            {"run_id": self.run_id, "name": self.name, "pid": os.getpid(),
             "hosts": [h.label for h in self.cluster.hosts]}))


def _terminate_leaves_the_line() -> Callable[[], None]:
    """While waiting in line, SIGTERM (`kill`, `timeout`, a logout) ends the wait as an
    exception, so the entry leaves every host's line at once instead of holding a place
    until it goes stale. Returns what puts the old handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def raise_exit(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, raise_exit)
    return lambda: signal.signal(signal.SIGTERM, previous)


def ticket_for(cluster, job, start_port: Optional[int], name: str) -> Ticket:
    gpus = {h.label: (list(job.gpus_for(h)) or None) for h in cluster.hosts}
    ports = {h.label: list(job.ports(start_port, h)) if start_port else [] for h in cluster.hosts}
    return Ticket(cluster, name, gpus, ports)


def waiting(handle: Optional[str] = None) -> List[dict]:
    """This controller's runs waiting in line whose waiting process lives (newest
    first), or only the one named ``handle`` (its --name or ticket id); a ticket whose
    process is gone is stale and removed."""
    try:
        files = list(tickets_dir().glob("*.json"))
    except OSError:
        return []
    found = []
    for path in files:
        try:
            ticket = json.loads(path.read_text())
            os.kill(int(ticket["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if handle is None or handle in (ticket.get("name"), ticket.get("run_id")):
            found.append(dict(ticket, path=str(path)))
    return sorted(found, key=lambda t: t.get("run_id", ""), reverse=True)


def waiting_line(ticket: dict) -> str:
    """``queued (run 20261127-..., "second"): waiting in line for h1, h2``."""
    name = f', "{ticket["name"]}"' if ticket.get("name") else ""
    return (f"queued (run {ticket.get('run_id')}{name}): waiting in line for "
            f"{fold(ticket.get('hosts') or [])}; `multihost status --all` shows the line, "
            f"`multihost stop {ticket.get('name') or ticket.get('run_id')}` leaves it")


def stop_queued(handle: str, timeout: float = 30.0) -> Optional[str]:
    """Take a run of this controller out of the line by its name or ticket id: the
    ticket's id, or None when no queued run has that name."""
    for ticket in waiting(handle):
        try:
            os.kill(int(ticket["pid"]), signal.SIGINT)
        except OSError:
            os.unlink(ticket["path"])  # its controller is gone: the entry goes stale
            return ticket.get("run_id")
        deadline = time.time() + timeout
        while os.path.exists(ticket["path"]) and time.time() < deadline:
            time.sleep(0.1)
        return ticket.get("run_id")
    return None


def wait_in_background(name: str, say: Callable[[str], None]) -> bool:
    """``run --queue --detach``: the waiting goes on in a process of its own session (a
    closed terminal does not end it), its output in ~/.multihost/queue/<pid>.log. True
    in the caller, which has nothing more to do; False in the process that waits."""
    tickets_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_fd)
        with os.fdopen(read_fd) as pipe:
            log = pipe.read().strip()
        os.waitpid(pid, 0)
        say(f"queued run {name or '(no name)'} waits for its hosts in the background "
            f"(output: {log}); `multihost status --all` with the same hosts shows its place, "
            f"`multihost stop {name or 'ID'}` takes it out of the line")
        return True
    os.close(read_fd)
    os.setsid()
    if os.fork():
        os._exit(0)
    log = tickets_dir() / f"{os.getpid()}.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    os.write(write_fd, str(log).encode())
    os.close(write_fd)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return False
