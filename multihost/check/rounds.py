"""The preflight's rounds: one helper call per host, all at once, and what each host's
thread learns from it (a ``Session``, turned into a frozen HostProbe at the end).

In a round with a rendezvous test the first host's call listens on the master port
first and holds the listener until every other host's call, which connects to it, is
done (``hold``). The other hosts' calls start with it, but each connects only once the
first host has said whether it listens (a word on its stdin; its other probes run
meanwhile): at 64 hosts on busy machines the first host's session may come up seconds
after the others', and a connection refused by a listener not yet there is not a firewall. Nothing waits on a dead host beyond its own timeouts and the round's
deadline.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from typing import Callable, Optional, Sequence

from .. import helper
from .calls import call, start, too_slow
from .model import HostProbe
from .report import CheckResult
from ..errors import CommandTimeout, ConnectError, MultihostError, RemoteError
from ..fanout import HostGroup
from ..hosts import Host
from ..transport import BrokenStream
from ..slurm.steps import keeps_steps
from ..untrusted import clean_report

CALL_SLACK = 7.0            # on top of the budget: ssh, python start, a cold helper upload
CONNECT_WINDOW = 3.0        # how long the other hosts retry the first host's listener
REPLY_TIME = 4.0            # the first host's reply, once it stops holding its listener

Progress = Callable[[Host, str], None]


class Session:
    """What one host's thread learns; turned into a frozen HostProbe at the end."""

    def __init__(self, host: Host):
        self.host = host
        self.address: Optional[str] = None
        self.local = False
        self.proxied = False
        self.port = host.port or 22
        self.reach: Optional[dict] = None
        self.via = "ssh"
        self.ssh_ms: Optional[float] = None
        self.ssh_error: Optional[MultihostError] = None
        self.facts: Optional[dict] = None
        self.facts_error: Optional[MultihostError] = None
        self.skew: Optional[float] = None
        self.skew_error = 0.0
        self.rendezvous: Optional[dict] = None
        self.rendezvous_error: Optional[str] = None

    def probe(self, budget: float, data: Optional[CheckResult],
              budgets: Optional[dict] = None) -> HostProbe:
        skew = self.skew
        if skew is not None:
            # The reply's trip back takes about half a round trip (the controller's ping),
            # and at most the whole slack.
            rtt = (self.reach or {}).get("rtt")
            skew += min(self.skew_error, rtt / 2000.0) if rtt is not None else self.skew_error / 2
        return HostProbe(self.host, self.address, self.local, self.via, self.reach,
                         self.ssh_ms, self.ssh_error, self.facts, self.facts_error, skew,
                         self.skew_error, self.rendezvous, self.rendezvous_error, data, budget,
                         dict(budgets or {}))


def _connect(cluster: HostGroup, session: Session, notify: Progress):
    """The ssh session (reused by later steps); its failure is the ssh check's."""
    if session.ssh_error is not None:
        return None
    notify(session.host, "connecting")
    began = time.monotonic()
    try:
        transport = cluster.transport(session.host)
    except ConnectError as err:
        session.ssh_error = err
        return None
    if keeps_steps(transport):
        # A node reached by srun has no login to time: one empty step of the job is what
        # every later command costs, and where srun's own failures show.
        session.via = "srun"
        return _first_step(cluster, session, transport)
    if session.ssh_ms is None:
        session.ssh_ms = (time.monotonic() - began) * 1000.0
    notify(session.host, "checking")
    return transport


def _first_step(cluster: HostGroup, session: Session, transport):
    if session.ssh_ms is not None:
        return transport
    began = time.monotonic()
    try:
        result = transport.run("true", timeout=cluster.options.connect_timeout + 20)
    except (ConnectError, CommandTimeout) as err:
        session.ssh_error = err if isinstance(err, ConnectError) else ConnectError(
            f"srun did not start a step here within {cluster.options.connect_timeout + 20:g}s",
            host=session.host.label, kind=ConnectError.TIMEOUT,
            fix="see what holds the job's nodes: squeue -w " + session.host.name)
        return None
    if result.exit_code != 0:
        said = result.stderr.decode("utf-8", "replace").strip().splitlines()
        session.ssh_error = ConnectError(
            f"srun could not run a step here: {said[-1] if said else f'exit {result.exit_code}'}",
            host=session.host.label, kind=ConnectError.UNREACHABLE,
            fix=f"try it by hand: srun --overlap -N 1 -w {session.host.name} true")
        return None
    session.ssh_ms = (time.monotonic() - began) * 1000.0
    return transport


def _store(session: Session, facts: dict, began_wall: float, merge: bool) -> None:
    received = time.time()
    if merge and session.facts is not None:
        merged = dict(session.facts)
        ports = dict(merged.get("ports") or {})
        ports.update(facts.get("ports") or {})
        merged["ports"] = ports
        merged["timed_out"] = sorted(set(merged.get("timed_out", [])) | set(facts.get("timed_out", [])))
        merged["errors"] = dict(merged.get("errors", {}), **facts.get("errors", {}))
        session.facts = merged
        return
    session.facts = facts
    # The remote clock read `time`, `age` seconds before its reply left; the reply took
    # between 0 and `slack` (the call minus the remote's own work) to arrive.
    session.skew = facts["time"] + facts.get("age", 0.0) - received
    session.skew_error = max(0.0, (received - began_wall) - facts.get("age", 0.0))


class Round:
    """One helper call per host, all at once. With ``listen_port`` the first host's call
    listens there first and holds the listener until every other host's call, which
    connects to it (retrying while it is not up yet, as torchrun's workers do), is done.
    ``merge``: a second round, whose facts are added to the first round's."""

    def __init__(self, cluster: HostGroup, sessions: Sequence[Session],
                 listen_port: Optional[int], budget: float, notify: Progress,
                 merge: bool = False):
        self.cluster = cluster
        self.sessions = sessions
        self.listen_port = listen_port
        self.notify = notify
        self.merge = merge
        self.timeout = budget + CALL_SLACK
        self.deadline = time.monotonic() + cluster.options.connect_timeout + self.timeout
        self.token = secrets.token_hex(8)
        self.master = sessions[0].address
        self.rendezvous = listen_port is not None
        self.peers_done = threading.Event()
        self.master_said = threading.Event()  # the first host listens (or never will)
        self.remaining = len(sessions) - 1
        self.lock = threading.Lock()
        # --fanout bounds the other hosts worked on at once; the first host, which holds its
        # listener until they are done, never waits for a slot.
        self.slots = threading.BoundedSemaphore(max(1, cluster.workers))

    def run(self, requests: Sequence[dict], on_started: Optional[Callable[[], None]]) -> None:
        if len(self.sessions) == 1:
            self.peers_done.set()
        if not self.rendezvous:
            self.master_said.set()
        threads = [threading.Thread(target=self.first, args=(self.sessions[0], requests[0]),
                                    daemon=True)]
        threads += [threading.Thread(target=self.peer, args=(s, r), daemon=True)
                    for s, r in zip(self.sessions[1:], requests[1:])]
        for thread in threads:
            thread.start()
        if on_started:
            on_started()
        for thread, session in zip(threads, self.sessions):
            thread.join(max(0.0, self.deadline - time.monotonic()))
            if thread.is_alive() and session.facts is None and session.facts_error is None:
                session.facts_error = CommandTimeout(
                    f"no answer within {self.cluster.options.connect_timeout + self.timeout:.0f}s",
                    host=session.host.label, fix="look at the host's load (uptime); --timeout "
                                                 "gives each host longer")

    def first(self, session: Session, request: dict) -> None:
        try:
            self.first_call(session, request)
        except MultihostError as err:
            self.failed(session, err)
        finally:
            self.master_said.set()
            self.notify(session.host, "done")

    def first_call(self, session: Session, request: dict) -> None:
        if self.merge and session.facts is None:
            return  # the first round already says why this host was not checked
        transport = _connect(self.cluster, session, self.notify)
        if transport is None:
            return
        began_wall = time.time()
        if not self.rendezvous:
            _store(session, call(transport, "check.host", request, self.timeout),
                   began_wall, self.merge)
            return
        # The listener outlives the round unless told (stdin closed, once every peer is
        # done): a peer whose python starts late on a busy host connects late, and a
        # listener gone a budget after this host's facts would have it told `refused`.
        request = dict(request, listen={"port": self.listen_port, "token": self.token,
                                        "address": self.master},
                       hold=max(self.timeout, self.deadline - time.monotonic()))
        _hold(transport, session, request, self.master_said, self.peers_done, self.deadline,
              began_wall, self.merge)

    def peer(self, session: Session, request: dict) -> None:
        try:
            with self.slots:
                self.peer_call(session, request)
        except MultihostError as err:
            self.failed(session, err)
        finally:
            self.notify(session.host, "done")
            self.peer_finished()

    def peer_call(self, session: Session, request: dict) -> None:
        if self.merge and session.facts is None:
            return
        transport = _connect(self.cluster, session, self.notify)
        if transport is None:
            return
        began_wall = time.time()
        if not self.rendezvous:
            _store(session, call(transport, "check.host", request, self.timeout),
                   began_wall, self.merge)
            return
        request = dict(request, probes=list(request["probes"]) + ["connect"],
                       connect={"address": self.master, "port": self.listen_port,
                                "token": self.token, "rank": session.host.rank,
                                "timeout": CONNECT_WINDOW},
                       await_listener=True,
                       await_for=max(1.0, self.deadline - time.monotonic()))
        facts = self.after_listener(transport, request)
        session.rendezvous = facts.pop("connect", None)
        _store(session, facts, began_wall, self.merge)

    def after_listener(self, transport, request: dict) -> dict:
        """A call that connects to the first host's listener, started at once beside the
        first host's: its other probes run meanwhile, its connect once told the first
        host said whether it listens (bounded by the round's deadline: the first host's
        thread says at the latest when its call ends, whatever happened to it)."""
        process = helper.launch(transport, "check.host", request)
        self.master_said.wait(max(0.0, self.deadline - time.monotonic()))
        # The call's own time, as a plain call has it, from the word on; and kill, not
        # close: the session's process group on the host ends with it.
        deadline = min(self.deadline, time.monotonic() + self.timeout)
        watchdog = threading.Timer(max(0.1, deadline - time.monotonic()), process.kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            try:
                process.stdin.write(b"go\n")
                process.stdin.close()
            except BrokenStream:
                pass  # it ended without reading (no helper there yet): said below
            try:
                out = process.stdout.read()
            except (OSError, ValueError):
                out = b""  # closed by the watchdog
            if time.monotonic() >= deadline:
                raise too_slow(transport, self.timeout)
            code = process.wait(max(0.1, deadline - time.monotonic()))
            err = process.read_stderr()
        finally:
            watchdog.cancel()
            process.close()
        if code == helper.MISSING:   # a host's first contact: the plain call installs it
            return call(transport, "check.host", request, self.timeout)
        return clean_report(helper.parse_reply(transport, "check.host", code, out, err))

    def failed(self, session: Session, err: MultihostError) -> None:
        if self.merge:  # the facts of the first round stand; only the rendezvous is lost
            session.rendezvous_error = f"the second round failed: {err.cause}"
        else:
            session.facts_error = err

    def peer_finished(self) -> None:
        with self.lock:
            self.remaining -= 1
            if self.remaining <= 0:
                self.peers_done.set()


def _hold(transport, session: Session, request: dict, said: threading.Event,
          peers_done: threading.Event, deadline: float, began_wall: float, merge: bool) -> None:
    """The first host's call: it says whether it listens, gathers its facts, and holds
    the listener until the others are done; then its stdin is closed and it replies.
    A watchdog ends the session at the deadline."""
    began = time.monotonic()
    try:
        process, line, watchdog = start(transport, "check.host_hold", request, deadline)
    finally:
        said.set()  # listening or not, the others may connect now
    try:
        try:
            said = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            said = None
        rest = b""
        if isinstance(said, dict) and "listening" in said:
            # Released in time to reply before the deadline: a peer that never answers
            # (its python hangs) is blamed alone, not this host with it.
            peers_done.wait(max(0.0, deadline - REPLY_TIME - time.monotonic()))
        else:
            rest = line  # an error reply (or garbage) instead of the greeting
        try:
            process.stdin.close()
        except OSError:
            pass
        rest += process.stdout.read()
        if time.monotonic() >= deadline:  # the watchdog ended the session
            raise too_slow(transport, deadline - began)
        code = process.wait(max(0.1, deadline - time.monotonic()))
        facts = clean_report(helper.parse_reply(transport, "check.host_hold", code, rest,
                                                process.read_stderr()))
    except (OSError, ValueError) as exc:
        if time.monotonic() >= deadline:
            raise too_slow(transport, deadline - began) from None
        raise RemoteError(f"the check session was cut: {exc}", host=session.host.label,
                          fix="check again (the same command)") from None
    finally:
        watchdog.cancel()
        process.close()
    session.rendezvous = facts.pop("rendezvous", None)
    _store(session, facts, began_wall, merge)
