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
import socket
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from .checks.network import choose_start_port
from .data_check import DataVerification
from .fixes import hosts_flags
from .judge import judge, make_survey, ping_matrix
from .registry import budgets_for, probes_for
from .report import CheckReport
from .rounds import Round, Session
from ..events import CheckStage, Listener
from ..fanout import HostGroup
from ..hosts import Host
from ..job import AUTO_PORT_RANGE, JobOptions, workdir_for
from ..remote.check import ping as net_ping
from ..remote.check import net
from ..run.records import run_ids

DEFAULT_BUDGET = 8.0        # seconds a host may spend gathering facts
PING_TIMEOUT = 1.0
DATA_TIMEOUT = 3 * 3600.0


def run_checks(cluster: HostGroup, job: JobOptions, *, workdirs: Optional[dict] = None,
               budget: float = DEFAULT_BUDGET, progress: Optional[Listener] = None,
               given: Optional[str] = None) -> CheckReport:
    """Check every host of ``cluster`` for ``job``; never raises for a host's problem
    (that is a failed check in the report). ``workdirs`` maps a Host, rank or label to
    its remote workdir (default: ``workdir_for(host, job.code)``). ``progress`` gets a
    CheckStage event as each host connects, is checked and is done. ``given``: the hosts
    as the user named them on the command line, for the fixes' commands (default: the
    same hosts as ``--ips``, see fixes.hosts_flags)."""
    started = time.monotonic()
    hosts = cluster.hosts
    given = hosts_flags(hosts) if given is None else given

    def notify(host: Host, stage: str) -> None:
        if progress is not None:
            progress(CheckStage(host.label, host.rank, stage))
    sessions = [Session(host) for host in hosts]
    _resolve(cluster, sessions)
    master = sessions[0].address
    reach = threading.Thread(target=_probe_reach, args=(cluster, sessions), daemon=True)
    reach.start()
    shared: List[Tuple[Tuple[str, ...], ...]] = []
    sharing = threading.Thread(target=lambda: shared.append(_shared_workdirs(
        cluster, {h.rank: _workdir(h, job, workdirs) for h in hosts})), daemon=True)
    sharing.start()
    data = DataVerification(cluster, job, {h.rank: _workdir(h, job, workdirs) for h in hosts},
                            given)
    auto = job.start_port is None
    requests = [_facts_request(s, sessions, job, _workdir(s.host, job, workdirs), budget)
                for s in sessions]
    # The round waits for its slowest probe's budget; a host done sooner is not held.
    longest = max([budget] + [b for r in requests for b in r["budgets"].values()])
    Round(cluster, sessions, None if auto else job.start_port, longest, notify).run(
        requests, data.start)
    start_port, note = job.start_port, ""
    if auto:
        start_port, note = _choose(sessions, job)
        if start_port is None:
            for session in sessions:
                session.rendezvous_error = "no free port range to test"
        else:
            second = [{"probes": ["ports"], "ports": list(job.ports(start_port, s.host)),
                       "budget": budget} for s in sessions]
            Round(cluster, sessions, start_port, budget, notify, merge=True).run(second, None)
    # The controller's ping waits PING_RETRY more for a silent host (a slow first ARP
    # resolution), then knocks on its ssh port: the join allows for both.
    reach.join(max(0.0, cluster.options.connect_timeout + 3 + net_ping.PING_RETRY
                   - (time.monotonic() - started)))
    # Hashing a big dataset the first time takes what it takes (its cache makes the next
    # time fast); the hours-long bound only guards against a hang.
    verified = data.results(timeout=DATA_TIMEOUT)
    probes = [s.probe(budget, verified.get(s.host.rank), r["budgets"])
              for s, r in zip(sessions, requests)]
    verdict = make_survey(probes, job, start_port, master, auto, note, known_runs=run_ids(),
                           given=given)
    sharing.join(30)
    return CheckReport(judge(verdict), start_port, master, ping_matrix(verdict), auto,
                       time.monotonic() - started, shared[0] if shared else ())


def _shared_workdirs(cluster: HostGroup, workdirs: dict) -> Tuple[Tuple[str, ...], ...]:
    """The labels of each group of hosts whose workdirs are one directory."""
    from ..sync.shared import find_sharing, forget_tokens

    from ..hosts import IN_PLACE

    # A job run in its own code directory (a project on the shared filesystem) leaves
    # no token in it: that directory is the user's.
    if len(cluster.hosts) < 2 or any(h.workdir == IN_PLACE for h in cluster.hosts):
        return ()
    labels = {h.rank: h.label for h in cluster.hosts}
    sharing = find_sharing(cluster, workdirs, make=False)
    forget_tokens(cluster, workdirs, sharing).join(30)
    return tuple(tuple(labels[r] for r in group) for group in sharing.groups)


def _facts_request(session: Session, sessions: Sequence[Session], job: JobOptions,
                   workdir: str, budget: float) -> dict:
    """What one host is asked in the first round (see remote/check/ops.gather): the
    probes its checks read (registry.probes_for)."""
    host = session.host
    low, high = AUTO_PORT_RANGE
    auto = job.start_port is None
    widest = max(len(job.ports(low, h.host)) for h in sessions)
    probes = probes_for(job, host)
    return {
        "probes": probes,
        "ports": [] if auto else list(job.ports(job.start_port, host)),
        "scan": [low, high + widest] if auto else None,
        "workdir": workdir, "master": sessions[0].address,
        "peers": [s.address for s in sessions if s is not session and s.address],
        "ping_timeout": PING_TIMEOUT, "budget": budget,
        "budgets": budgets_for(probes, budget),
        "data": list(job.data) + list(host.data),
        "image": job.image, "engine": job.engine,
        # Where the controller's own environment lives: a host may have one at the same
        # path, with the framework its python3 lacks (remote/check/python).
        "prefix": sys.prefix,
    }


def _workdir(host: Host, job: JobOptions, workdirs: Optional[dict]) -> str:
    for key in (host, host.rank, host.label, host.name):
        if workdirs and key in workdirs:
            return str(workdirs[key])
    return workdir_for(host, job.code)


def _resolve(cluster: HostGroup, sessions: Sequence[Session]) -> None:
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
            from ..transport.ssh_login import load_ssh_config, resolve_target

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


def _probe_reach(cluster: HostGroup, sessions: Sequence[Session]) -> None:
    """ICMP from the controller to every host at once; a TCP probe of the ssh port for
    those that do not answer (or when ICMP is not permitted here)."""
    targets = [s for s in sessions if not s.local]
    for session in targets:
        if session.proxied:
            session.reach = {"skip": "behind a ProxyJump: not reachable from the controller"}
    targets = [s for s in targets if not s.proxied and s.address]
    if not targets:
        return
    rtt, method = net_ping.ping_many([s.address for s in targets], PING_TIMEOUT)
    silent = [s for s in targets if rtt.get(s.address) is None]
    tcp: Dict[int, dict] = {}

    def knock(session: Session) -> None:
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


def _choose(sessions: Sequence[Session], job: JobOptions) -> Tuple[Optional[int], str]:
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
