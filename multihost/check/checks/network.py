"""What the job needs from the network: free ports (and ``--start-port auto``), the
rendezvous connection to the first host, host-to-host ping, the interface towards the
first host."""
from __future__ import annotations

import ipaddress
from typing import Dict, Iterable, Optional, Sequence, Set

from ..judge import Survey, HostProbe, folded, groups, not_checked, route_iface, same_machine
from .. import fixes
from .sharing import holders
from ...remote.registry.holds import holder_line
from ..registry import check
from ..report import FAIL, PASS, SKIP, WARN, CheckResult
from ...hosts import Host
from ...job import AUTO_PORT_RANGE, JobOptions

AUTO_FIX = "add `--start-port auto` (multihost picks a range free on every host)"


def _port_fix(probe: HostProbe, survey: Survey, pid: Optional[int] = None) -> str:
    """Free ports first (nothing else to stop), then stopping the holder, when known."""
    if not pid:
        return AUTO_FIX + ", or stop what holds the port"
    kill = fixes.run(fixes.on_host(survey.given, probe.host, "kill", str(pid)))
    return f"{AUTO_FIX}, or stop that process: {kill}"


# -- ports ----------------------------------------------------------------------------
def choose_start_port(busy_by_host: Dict[int, Iterable[int]], hosts: Sequence[Host],
                      job: JobOptions) -> Optional[int]:
    """The lowest start port in 10000-20000 whose whole range is free on every host."""
    low, high = AUTO_PORT_RANGE
    taken: Dict[int, Set[int]] = {rank: set(ports) for rank, ports in busy_by_host.items()}
    for start in range(low, high + 1):
        if all(not taken.get(h.rank, set()).intersection(job.ports(start, h)) and
               job.ports(start, h)[-1] <= high for h in hosts):
            return start
    return None


@check("ports", order=60, probes=("ports",), short="port")
def judge_ports(probe: HostProbe, survey: Survey) -> CheckResult:
    original = same_machine(survey).get(probe.host.rank)
    if original is not None:
        # Its ports are its original's: the first host's listener would be reported as
        # a port in use by multihost itself.
        return CheckResult("ports", SKIP, "not checked: the same machine as "
                           f"{original.host.label}", brief="-")
    skipped = not_checked(probe, "ports")
    if skipped:
        return skipped
    if survey.start_port is None:
        return CheckResult("ports", FAIL, "no range of free ports in 10000-20000 on every host",
                           "stop what holds them, or give --start-port", "none free")
    ports = survey.job.ports(survey.start_port, probe.host)
    span = f"{ports[0]}-{ports[-1]}"
    facts = probe.fact("ports") or {}
    busy = [b for b in facts.get("busy", []) if b.get("port") in ports]
    listener = probe.rendezvous or {}
    if probe.host.rank == 0 and listener.get("listening") is False and not busy:
        return CheckResult("ports", FAIL, f"port {ports[0]} can not be bound: "
                                          f"{listener.get('error')}",
                               _port_fix(probe, survey), f"{ports[0]} busy")
    held = holders(probe, survey)
    if busy and held:  # a run holds them: busy says so, with the fix (another port would
        # put a second job on its GPUs)
        return CheckResult("ports", SKIP, f"port {busy[0]['port']} is held by "
                                          f"{holder_line(held[0])} (see busy)", brief="held")
    if busy:
        first = busy[0]
        owner = (f" by pid {first['pid']} ({first.get('command', '?')})" if first.get("pid")
                 else " (its owner is not visible to this user)")
        more = f"; also {', '.join(str(b['port']) for b in busy[1:])}" if len(busy) > 1 else ""
        return CheckResult("ports", FAIL, f"port {first['port']} is in use{owner}{more}",
                           _port_fix(probe, survey, first.get("pid")), f"{first['port']} busy")
    auto = f" ({survey.auto_note})" if survey.auto_port else ""
    ephemeral = facts.get("ephemeral")
    if ephemeral and len(ephemeral) == 2 and ports[0] <= ephemeral[1] and ports[-1] >= ephemeral[0]:
        return CheckResult("ports", WARN, f"{span} lie in the ephemeral range {ephemeral[0]}-"
                                          f"{ephemeral[1]}: an outgoing connection may take one",
                           "pick --start-port below the ephemeral range "
                           "(net.ipv4.ip_local_port_range)", span)
    return CheckResult("ports", PASS, f"{span} free{auto}", brief=span)


# -- the network ----------------------------------------------------------------------
def _is_loopback(address: Optional[str]) -> bool:
    try:
        return bool(address) and ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return address == "localhost"


# Its probe, "connect", is asked by the rendezvous round (rounds.py), not the facts round.
@check("rendezvous", order=70, source="connect", short="rdzv")
def judge_rendezvous(probe: HostProbe, survey: Survey) -> CheckResult:
    skipped = not_checked(probe, "rendezvous")
    if skipped:
        return skipped
    master, port = survey.master_addr, survey.start_port
    where = f"{master}:{port}"
    n = len(survey.probes)
    if probe.host.rank == 0:
        if n > 1 and _is_loopback(master):
            return CheckResult("rendezvous", FAIL, f"the first host is {master}, which other "
                                                   "hosts can not reach",
                               "name the first host by its network address in --ips or the "
                               "hostfile", "loopback")
        listener = probe.rendezvous
        if listener is None:
            return CheckResult("rendezvous", SKIP, f"not tested: "
                                                   f"{probe.rendezvous_error or 'no answer'}",
                               brief="-")
        if not listener.get("listening"):
            return CheckResult("rendezvous", FAIL, f"can not listen on port {port}: "
                                                   f"{listener.get('error')}",
                               _port_fix(probe, survey), "no listen")
        ranks = {a.get("rank") for a in listener.get("accepted", [])}
        expected = n - 1
        if n == 1:
            return CheckResult("rendezvous", PASS, f"listening on :{port} works (single host)",
                               brief=f":{port}")
        return CheckResult("rendezvous", PASS, f"listening on :{port}; "
                                               f"{len(ranks - {None})}/{expected} hosts connected",
                           brief=f":{port} {len(ranks - {None})}/{expected}")
    why = _first_host_unready(survey)
    if why:
        return CheckResult("rendezvous", SKIP, f"not tested: {why}", brief="-")
    result = probe.rendezvous
    if result is None:
        return CheckResult("rendezvous", SKIP, f"not tested: "
                                               f"{probe.rendezvous_error or 'no answer'}", brief="-")
    if result.get("ok"):
        return CheckResult("rendezvous", PASS, f"connected to {where} in {result['ms']:.1f} ms",
                           brief="ok")
    error = result.get("error")
    causes = {
        "refused": (f"{where} refused the connection",
                    f"a firewall on {master} rejects port {port}: allow TCP {port} from this host"),
        "timeout": (f"no answer from {where}",
                    f"a firewall drops TCP {port} between this host and {master}, or the route "
                    "is broken: see the ping check"),
        "unreachable": (f"{master} is unreachable from this host ({result.get('text')})",
                        f"check the route from this host to {master}"),
        "foreign": (f"another program answers on {where}, not multihost's listener",
                    f"something intercepts port {port} (a proxy or NAT), or another host "
                    f"holds {master}"),
        "name": (f"{master} does not resolve on this host",
                 "use the first host's IP address, or add it to /etc/hosts on every host"),
    }
    detail, fix = causes.get(error, (f"can not connect to {where}: {result.get('text')}",
                                    f"check the network between this host and {master}"))
    return CheckResult("rendezvous", FAIL, detail, fix, error or "failed")


def _first_host_unready(survey: Survey) -> Optional[str]:
    """Why the other hosts' connections to the first host prove nothing, if they don't."""
    first = survey.probes[0]
    if first.ssh_error is not None or first.facts is None:
        return "the first host could not be checked"
    if _is_loopback(survey.master_addr):
        return f"the first host is named by a loopback address ({survey.master_addr})"
    listener = first.rendezvous
    if listener is None:
        return first.rendezvous_error or "the first host's listener did not report"
    if not listener.get("listening"):
        return f"the first host could not listen on :{survey.start_port}"
    return None


@check("ping", order=80, probes=("ping",))
def judge_ping(probe: HostProbe, survey: Survey) -> CheckResult:
    if len(survey.probes) == 1:
        return CheckResult("ping", SKIP, "single host", brief="-")
    skipped = not_checked(probe, "ping")
    if skipped:
        return skipped
    ping = probe.fact("ping") or {}
    rtt = ping.get("rtt", {})
    peers = [p for p in survey.probes if p.host.rank != probe.host.rank]
    if ping.get("method") is None:
        return CheckResult("ping", SKIP, "this host may not send ICMP (no ping socket, raw "
                                         "socket or ping command)", brief="no ICMP")
    silent = [p.host.label for p in peers if rtt.get(p.address) is None]
    if silent:
        return CheckResult("ping", FAIL, f"no echo from {folded(silent)} "
                                         f"({len(silent)} of {len(peers)} hosts)",
                           "every host must ping every other (the reference setup needs it): "
                           "check links, routes and firewalls between them (see the matrix)",
                           f"{len(peers) - len(silent)}/{len(peers)}")
    worst = max(rtt.get(p.address) or 0.0 for p in peers)
    return CheckResult("ping", PASS, f"{len(peers)}/{len(peers)} hosts answer, slowest "
                                     f"{worst:.2f} ms", brief=f"{len(peers)}/{len(peers)}")



@check("iface", order=90, probes=("net", "hostname"), short="if")
def judge_iface(probe: HostProbe, survey: Survey) -> CheckResult:
    skipped = not_checked(probe, "iface")
    if skipped:
        return skipped
    net = probe.fact("net") or {}
    names = sorted(net.get("interfaces", {}))
    master, found = survey.master_addr, net.get("route_iface")
    chosen = probe.host.iface or found
    if probe.host.iface and probe.host.iface not in names:
        return CheckResult("iface", FAIL, f"interface {probe.host.iface} (from the hostfile) does "
                                          f"not exist here; found {', '.join(names)}",
                           f"fix iface = for this host, or remove it to use {found}", "missing")
    if found is None:
        return CheckResult("iface", FAIL, f"no route from this host to {master} (the first host)",
                           f"check this host's addresses and routes (`ip route get {master}`)",
                           "no route")
    if probe.host.rank == 0 and not net.get("master_is_local", True):
        return CheckResult("iface", WARN, f"{master} is not an address of this host (NAT, or an "
                                          "ssh alias for another machine?)",
                           "name the first host by an address it holds itself", chosen)
    if probe.host.iface and probe.host.iface != found:
        return CheckResult("iface", WARN, f"the hostfile says {probe.host.iface}, but the route to "
                                          f"{master} goes through {found}",
                           "make iface = match the interface that reaches the first host", chosen)
    loopback = _loopback_hostname(probe, chosen) if len(survey.probes) > 1 else None
    if loopback:  # alone, every rank is on this machine and loopback is fine
        return loopback
    reference = chosen if probe.host.rank == 0 else (survey.probes[0].host.iface
                                                     or route_iface(survey.probes[0]))
    others = {p.host.rank: (p.host.iface or route_iface(p)) for p in survey.probes}
    others = {r: v for r, v in others.items() if v}
    if reference and chosen != reference and len(set(others.values())) > 1:
        return CheckResult("iface", WARN, f"interface names differ: {groups(others, survey)}",
                           "multihost run sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME per "
                           "host; launching by hand, set them per host too", chosen)
    source = net.get("route_source")
    return CheckResult("iface", PASS, f"{chosen} ({source}) reaches {master}", brief=chosen)


def _loopback_hostname(probe: HostProbe, iface: str) -> Optional[CheckResult]:
    """Pitfall 7: gloo (and paddle) find their own address by the hostname; Debian's
    `127.0.1.1 <hostname>` line makes it loopback and the other hosts are refused."""
    hostname = probe.fact("hostname") or {}
    addresses = hostname.get("addresses") or []
    name = hostname.get("hostname", "the hostname")
    fix = (f"multihost run sets GLOO_SOCKET_IFNAME={iface} for you; for other launchers "
           f"export it, or map {name} to its real address in /etc/hosts")
    if hostname.get("error") or not addresses:
        return CheckResult("iface", WARN, f"hostname {name} does not resolve: gloo and paddle "
                                          "look themselves up by it", fix, f"{iface} !")
    if _is_loopback(addresses[0]):
        return CheckResult("iface", WARN, f"hostname {name} resolves to {addresses[0]}: gloo "
                                          "would bind loopback and other hosts could not "
                                          "connect", fix, f"{iface} !")
    return None


