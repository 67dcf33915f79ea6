"""The preflight: can this exact cluster run this exact job? ``run_checks`` answers in
about the time it takes to touch every host once.

How: every host gets ONE helper call that gathers everything it can tell about itself in
parallel threads (software, GPUs, ports, route, disk, leftovers, and an ICMP echo to
every other host). The first host's call opens a temporary listener on the master port
before it gathers, and holds it until the others are done; the other hosts' calls,
started at the same time, connect to it (retrying while it is not up yet, as torchrun's
workers do): the rendezvous test rides in the same round trip. Meanwhile the controller
pings every host. ``--start-port auto`` needs a second, short round: the port is known
only once every host has said which ports it uses.

Nothing waits on a dead host beyond its own timeouts: connect (``--connect-timeout``),
the helper's budget, and a deadline after which a host is reported as not answering.
"""
from __future__ import annotations

import ipaddress
import json
import secrets
import socket
import threading
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

from .. import helper
from .calls import call, start, too_slow
from .data_check import DataVerification
from .judge import HostProbe
from .job_needs import choose_start_port, judge, make_cluster, ping_matrix
from .report import CheckReport, CheckResult
from ..errors import CommandTimeout, ConnectError, MultihostError, RemoteError
from ..events import CheckStage, Listener
from ..fanout import Cluster
from ..hosts import Host
from ..job import AUTO_PORT_RANGE, JobOptions, workdir_for
from ..remote import ops_check_net as net
from ..run.records import run_ids
from ..untrusted import clean_report

FACT_PROBES = ("hostname", "python", "gpus", "ports", "net", "disk", "leftovers", "ping")
DEFAULT_BUDGET = 8.0        # seconds a host may spend gathering facts
CALL_SLACK = 7.0            # on top of the budget: ssh, python start, a cold helper upload
PING_TIMEOUT = 1.0
DATA_TIMEOUT = 3 * 3600.0
CONNECT_WINDOW = 3.0        # how long the other hosts retry the first host's listener

Progress = Callable[[Host, str], None]   # inside the check: a host reached a stage


def run_checks(cluster: Cluster, job: JobOptions, *, workdirs: Optional[dict] = None,
               budget: float = DEFAULT_BUDGET, progress: Optional[Listener] = None) -> CheckReport:
    """Check every host of ``cluster`` for ``job``; never raises for a host's problem
    (that is a failed check in the report). ``workdirs`` maps a Host, rank or label to
    its remote workdir (default: ``workdir_for(host, job.code)``). ``progress`` gets a
    CheckStage event as each host connects, is checked and is done."""
    started = time.monotonic()
    hosts = cluster.hosts

    def notify(host: Host, stage: str) -> None:
        if progress is not None:
            progress(CheckStage(host.label, host.rank, stage))
    sessions = [_Session(host) for host in hosts]
    _resolve(cluster, sessions)
    master = sessions[0].address
    reach = threading.Thread(target=_probe_reach, args=(cluster, sessions), daemon=True)
    reach.start()
    data = DataVerification(cluster, job, {h.rank: _workdir(h, job, workdirs) for h in hosts})
    auto = job.start_port is None
    requests = [_facts_request(s, sessions, job, _workdir(s.host, job, workdirs), budget)
                for s in sessions]
    _round(cluster, sessions, requests, None if auto else job.start_port, budget, notify,
           data.start)
    start_port, note = job.start_port, ""
    if auto:
        start_port, note = _choose(sessions, job)
        if start_port is None:
            for session in sessions:
                session.rendezvous_error = "no free port range to test"
        else:
            second = [{"probes": ["ports"], "ports": list(job.ports(start_port, s.host)),
                       "budget": budget} for s in sessions]
            _round(cluster, sessions, second, start_port, budget, notify, None, merge=True)
    # The controller's ping waits PING_RETRY more for a silent host (a slow first ARP
    # resolution), then knocks on its ssh port: the join allows for both.
    reach.join(max(0.0, cluster.options.connect_timeout + 3 + net.PING_RETRY
                   - (time.monotonic() - started)))
    # Hashing a big dataset the first time takes what it takes (its cache makes the next
    # time fast); the hours-long bound only guards against a hang.
    verified = data.results(timeout=DATA_TIMEOUT)
    probes = [s.probe(budget, verified.get(s.host.rank)) for s in sessions]
    verdict = make_cluster(probes, job, start_port, master, auto, note, known_runs=run_ids())
    return CheckReport(judge(verdict), start_port, master, ping_matrix(verdict), auto,
                       time.monotonic() - started)


def _facts_request(session: "_Session", sessions: Sequence["_Session"], job: JobOptions,
                   workdir: str, budget: float) -> dict:
    """What one host is asked in the first round (see remote/ops_check.gather)."""
    host = session.host
    low, high = AUTO_PORT_RANGE
    auto = job.start_port is None
    widest = max(len(job.ports(low, h.host)) for h in sessions)
    return {
        "probes": list(FACT_PROBES) + (["data"] if job.data or host.data else []),
        "ports": [] if auto else list(job.ports(job.start_port, host)),
        "scan": [low, high + widest] if auto else None,
        "workdir": workdir, "master": sessions[0].address,
        "peers": [s.address for s in sessions if s is not session and s.address],
        "ping_timeout": PING_TIMEOUT, "budget": budget,
        "data": list(job.data) + list(host.data),
    }


def _workdir(host: Host, job: JobOptions, workdirs: Optional[dict]) -> str:
    for key in (host, host.rank, host.label, host.name):
        if workdirs and key in workdirs:
            return str(workdirs[key])
    return workdir_for(host, job.code)


class _Session:
    """What one host's thread learns; turned into a frozen HostProbe at the end."""

    def __init__(self, host: Host):
        self.host = host
        self.address: Optional[str] = None
        self.local = False
        self.proxied = False
        self.port = host.port or 22
        self.reach: Optional[dict] = None
        self.ssh_ms: Optional[float] = None
        self.ssh_error: Optional[MultihostError] = None
        self.facts: Optional[dict] = None
        self.facts_error: Optional[MultihostError] = None
        self.skew: Optional[float] = None
        self.skew_error = 0.0
        self.rendezvous: Optional[dict] = None
        self.rendezvous_error: Optional[str] = None

    def probe(self, budget: float, data: Optional[CheckResult]) -> HostProbe:
        skew = self.skew
        if skew is not None:
            # The reply's trip back takes about half a round trip (the controller's ping),
            # and at most the whole slack.
            rtt = (self.reach or {}).get("rtt")
            skew += min(self.skew_error, rtt / 2000.0) if rtt is not None else self.skew_error / 2
        return HostProbe(self.host, self.address, self.local, self.reach, self.ssh_ms,
                         self.ssh_error, self.facts, self.facts_error, skew, self.skew_error,
                         self.rendezvous, self.rendezvous_error, data, budget)


def _resolve(cluster: Cluster, sessions: Sequence[_Session]) -> None:
    """The address every host is known by, as ssh would reach it (ssh config applied);
    names are looked up in parallel, a slow DNS costs its delay once."""
    from concurrent.futures import ThreadPoolExecutor

    from ..transport import is_local_host

    config = None
    names = []
    for session in sessions:
        host = session.host
        session.local = is_local_host(host)
        name = host.name
        if not session.local:
            from ..transport.ssh import load_ssh_config, resolve_target

            config = config or load_ssh_config(cluster.options.config_file)
            target = resolve_target(host, cluster.options, config)
            name, session.port, session.proxied = target.hostname, target.port, bool(target.proxy_jump)
        names.append(name)
    if all(_is_address(name) for name in names):
        addresses = names
    else:
        with ThreadPoolExecutor(max_workers=min(32, len(names))) as pool:
            addresses = list(pool.map(_numeric, names))
    for session, address in zip(sessions, addresses):
        session.address = address


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%")[0])
        return True
    except ValueError:
        return False


def _numeric(name: str) -> str:
    if _is_address(name):
        return name
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
    except OSError:
        return name  # the ssh check says why; the hosts may still resolve it themselves
    families = [info for info in infos if info[0] == socket.AF_INET] or infos
    return families[0][4][0]


def _probe_reach(cluster: Cluster, sessions: Sequence[_Session]) -> None:
    """ICMP from the controller to every host at once; a TCP probe of the ssh port for
    those that do not answer (or when ICMP is not permitted here)."""
    targets = [s for s in sessions if not s.local]
    for session in targets:
        if session.proxied:
            session.reach = {"skip": "behind a ProxyJump: not reachable from the controller"}
    targets = [s for s in targets if not s.proxied and s.address]
    if not targets:
        return
    rtt, method = net.ping_many([s.address for s in targets], PING_TIMEOUT)
    silent = [s for s in targets if rtt.get(s.address) is None]
    tcp: Dict[int, dict] = {}

    def knock(session: _Session) -> None:
        tcp[session.host.rank] = net.tcp_probe(session.address, session.port,
                                               min(2.0, cluster.options.connect_timeout))

    threads = [threading.Thread(target=knock, args=(s,), daemon=True) for s in silent]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(3.0)
    for session in targets:
        session.reach = {"rtt": rtt.get(session.address), "method": method,
                         "tcp": tcp.get(session.host.rank)}


def _connect(cluster: Cluster, session: _Session, notify: Progress):
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
    if session.ssh_ms is None:
        session.ssh_ms = (time.monotonic() - began) * 1000.0
    notify(session.host, "checking")
    return transport


def _store(session: _Session, facts: dict, began_wall: float, merge: bool) -> None:
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


def _round(cluster: Cluster, sessions: Sequence[_Session], requests: Sequence[dict],
           listen_port: Optional[int], budget: float, notify: Progress,
           on_started: Optional[Callable[[], None]], merge: bool = False) -> None:
    """One helper call per host, all at once. With ``listen_port`` the first host's call
    listens there first and holds the listener until every other host's call, which
    connects to it (retrying while it is not up yet, as torchrun's workers do), is done."""
    deadline = time.monotonic() + cluster.options.connect_timeout + budget + CALL_SLACK
    timeout = budget + CALL_SLACK
    token = secrets.token_hex(8)
    master = sessions[0].address
    peers_done = threading.Event()
    remaining = [len(sessions) - 1]
    lock = threading.Lock()
    rendezvous = listen_port is not None
    # --fanout bounds the other hosts worked on at once; the first host, which holds its
    # listener until they are done, never waits for a slot.
    slots = threading.BoundedSemaphore(max(1, cluster.workers))

    def failed(session: _Session, err: MultihostError) -> None:
        if merge:  # the facts of the first round stand; only the rendezvous is lost
            session.rendezvous_error = f"the second round failed: {err.cause}"
        else:
            session.facts_error = err

    def peer_finished() -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0] <= 0:
                peers_done.set()

    def first(session: _Session, request: dict) -> None:
        try:
            if merge and session.facts is None:
                return  # the first round already says why this host was not checked
            transport = _connect(cluster, session, notify)
            if transport is None:
                return
            began_wall = time.time()
            if not rendezvous:
                _store(session, call(transport, "check.host", request, timeout),
                       began_wall, merge)
                return
            request = dict(request, listen={"port": listen_port, "token": token,
                                            "address": master}, hold=timeout)
            _hold(transport, session, request, peers_done, deadline, began_wall, merge)
        except MultihostError as err:
            failed(session, err)
        finally:
            notify(session.host, "done")

    def peer(session: _Session, request: dict) -> None:
        try:
            with slots:
                peer_call(session, request)
        except MultihostError as err:
            failed(session, err)
        finally:
            notify(session.host, "done")
            peer_finished()

    def peer_call(session: _Session, request: dict) -> None:
        if merge and session.facts is None:
            return
        transport = _connect(cluster, session, notify)
        if transport is None:
            return
        if rendezvous:
            request = dict(request, probes=list(request["probes"]) + ["connect"],
                           connect={"address": master, "port": listen_port, "token": token,
                                    "rank": session.host.rank, "timeout": CONNECT_WINDOW})
        began_wall = time.time()
        facts = call(transport, "check.host", request, timeout)
        if rendezvous:
            session.rendezvous = facts.pop("connect", None)
        _store(session, facts, began_wall, merge)

    if len(sessions) == 1:
        peers_done.set()
    threads = [threading.Thread(target=first, args=(sessions[0], requests[0]), daemon=True)]
    threads += [threading.Thread(target=peer, args=(s, r), daemon=True)
                for s, r in zip(sessions[1:], requests[1:])]
    for thread in threads:
        thread.start()
    if on_started:
        on_started()
    for thread, session in zip(threads, sessions):
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive() and session.facts is None and session.facts_error is None:
            session.facts_error = CommandTimeout(
                f"no answer within {cluster.options.connect_timeout + timeout:.0f}s",
                host=session.host.label, fix="look at the host's load (uptime); --timeout "
                                             "gives each host longer")


def _hold(transport, session: _Session, request: dict, peers_done: threading.Event,
          deadline: float, began_wall: float, merge: bool) -> None:
    """The first host's call: it says whether it listens, gathers its facts, and holds
    the listener until the others are done; then its stdin is closed and it replies.
    A watchdog ends the session at the deadline."""
    began = time.monotonic()
    process, line, watchdog = start(transport, "check.host_hold", request, deadline)
    try:
        try:
            said = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            said = None
        rest = b""
        if isinstance(said, dict) and "listening" in said:
            peers_done.wait(max(0.0, deadline - time.monotonic()))
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
                          fix="run multihost check again") from None
    finally:
        watchdog.cancel()
        process.close()
    session.rendezvous = facts.pop("rendezvous", None)
    _store(session, facts, began_wall, merge)


def _choose(sessions: Sequence[_Session], job: JobOptions) -> Tuple[Optional[int], str]:
    """--start-port auto: the lowest range free on every host that answered."""
    answered = [s for s in sessions if s.facts and "listening" in (s.facts.get("ports") or {})]
    busy = {s.host.rank: s.facts["ports"]["listening"] for s in answered}
    start = choose_start_port(busy, [s.host for s in answered], job)
    low = AUTO_PORT_RANGE[0]
    if start is None:
        return None, ""
    skipped = sorted({p for ports in busy.values() for p in ports if low <= p < start})
    why = f"; {', '.join(map(str, skipped[:5]))} in use" if skipped else ""
    return start, f"auto: lowest free range from {low}{why}"
