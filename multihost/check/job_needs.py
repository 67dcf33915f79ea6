"""Judging what the job needs from each host: GPUs, ports (and ``--start-port auto``),
the rendezvous connection to the first host, host-to-host ping, the network interface,
the data. Pure, like ``check_eval``; ``judge`` puts every check together into reports.
"""
from __future__ import annotations

import ipaddress
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .judge import (HOST_JUDGES, Cluster, HostProbe, folded, groups, judge_leftovers,
                         judge_machine, judge_software, not_checked, same_machine)
from .parsers import fold_ranges, parse_gpu_apps, parse_gpus, parse_software
from .report import CHECKS, FAIL, PASS, SKIP, WARN, CheckResult, HostReport, PingMatrix
from ..hosts import Host
from ..job import AUTO_PORT_RANGE, JobOptions

AUTO_FIX = "stop that process, or let multihost pick free ports: --start-port auto"


# -- GPUs -----------------------------------------------------------------------------
def judge_gpus(probe: HostProbe, cluster: Cluster) -> CheckResult:
    skipped = not_checked(probe, "gpus")
    if skipped:
        return skipped
    job, host = cluster.job, probe.host
    want, nproc = job.gpus_for(host), job.nproc_for(host)
    facts = probe.fact("gpus") or {}
    cpus = probe.facts.get("cpus") or 0
    gpus = parse_gpus(facts.get("out", "")) if facts.get("code") == 0 else ()
    if not want:
        if cpus and nproc > cpus:
            return CheckResult("gpus", WARN, f"CPU job: {nproc} processes on {cpus} CPUs",
                               f"use --nproc_per_node {cpus} or fewer, or they will contend",
                               f"CPU {nproc}>{cpus}")
        idle = f"; {len(gpus)} GPUs unused" if gpus else ""
        return CheckResult("gpus", PASS, f"CPU job: {nproc} process{'es' if nproc > 1 else ''} "
                                         f"on {cpus} CPUs{idle}", brief="CPU")
    asked = fold_ranges(want)
    problem = _driver_problem(facts, asked)
    if problem:
        return problem
    have = {gpu.index: gpu for gpu in gpus}
    missing = [i for i in want if i not in have]
    if missing:
        found = f"{len(gpus)} ({fold_ranges(have)})" if gpus else "none"
        return CheckResult("gpus", FAIL, f"GPU {fold_ranges(missing)} requested; this host has {found}",
                           "list only GPUs this host has: gpus = in its hostfile section, or --gpus",
                           f"{len(gpus)} GPUs")
    software = cluster.software.get(host.rank)
    if software and software.torch and not software.torch_cuda and not software.paddle:
        return CheckResult("gpus", FAIL, f"torch {software.torch} is a CPU build, but the job "
                                         f"asks for GPUs {asked}",
                           f"install a CUDA build of torch into {software.executable}", "CPU torch")
    chosen = [have[i] for i in want]
    model = chosen[0].name
    memory = f" ({chosen[0].memory_mib // 1024} GiB)" if chosen[0].memory_mib else ""
    text = f"GPUs {asked} of {len(gpus)}x {model}{memory}, driver {chosen[0].driver}"
    uuids = {gpu.uuid: gpu.index for gpu in chosen}
    busy = [app for app in parse_gpu_apps(facts.get("apps", "")) if app.uuid in uuids]
    if busy:
        app = busy[0]
        used = f", {app.used_mib} MiB" if app.used_mib else ""
        return CheckResult("gpus", WARN, f"GPU {uuids[app.uuid]} is in use by pid {app.pid} "
                                         f"({app.name}{used}); {len(busy)} process(es) on the "
                                         "requested GPUs", "stop them, or pick other GPUs with --gpus",
                           "busy")
    if nproc > len(want):
        return CheckResult("gpus", WARN, f"{nproc} processes share {len(want)} GPUs: {text}",
                           "give --nproc_per_node equal to the number of GPUs", "shared")
    models = {p.host.rank: _model(p) for p in cluster.probes if cluster.job.gpus_for(p.host)}
    models = {r: m for r, m in models.items() if m}
    if len(set(models.values())) > 1 and models.get(host.rank) != models.get(0):
        return CheckResult("gpus", WARN, f"mixed GPU models: {groups(models, cluster)}",
                           "the job runs at the pace of the slowest GPU; use one model if you can",
                           "mixed")
    return CheckResult("gpus", PASS, text, brief=f"{len(want)}x {model.replace('NVIDIA ', '')}")


def _driver_problem(facts: dict, asked: str) -> Optional[CheckResult]:
    """nvidia-smi missing, hung or failing, while the job asks for GPUs."""
    if facts.get("missing"):
        return CheckResult("gpus", FAIL, f"no nvidia-smi (no NVIDIA driver), but the job asks "
                                         f"for GPUs {asked}",
                           "install the NVIDIA driver, or run on CPU (no --gpus; gpus = none)",
                           "no driver")
    if facts.get("timeout"):
        return CheckResult("gpus", FAIL, f"nvidia-smi did not answer within {facts['timeout']}s",
                           "a GPU or the driver may be hung: check `dmesg` for Xid errors, "
                           "reset the GPU or reboot", "timeout")
    if facts.get("code") != 0:
        said = (facts.get("err") or facts.get("out") or "").strip().splitlines()
        last = said[-1] if said else f"exit {facts.get('code')}"
        return CheckResult("gpus", FAIL, f"nvidia-smi failed: {last}",
                           "check the NVIDIA driver: run nvidia-smi on the host", "driver error")
    return None


def _model(probe: HostProbe) -> Optional[str]:
    facts = probe.fact("gpus") or {}
    gpus = parse_gpus(facts.get("out", "")) if facts.get("code") == 0 else ()
    return gpus[0].name if gpus else None


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


def judge_ports(probe: HostProbe, cluster: Cluster) -> CheckResult:
    skipped = not_checked(probe, "ports")
    if skipped:
        return skipped
    if cluster.start_port is None:
        return CheckResult("ports", FAIL, "no range of free ports in 10000-20000 on every host",
                           "stop what holds them, or give --start-port", "none free")
    ports = cluster.job.ports(cluster.start_port, probe.host)
    span = f"{ports[0]}-{ports[-1]}"
    facts = probe.fact("ports") or {}
    busy = [b for b in facts.get("busy", []) if b.get("port") in ports]
    listener = probe.rendezvous or {}
    if probe.host.rank == 0 and listener.get("listening") is False and not busy:
        return CheckResult("ports", FAIL, f"port {ports[0]} can not be bound: "
                                          f"{listener.get('error')}", AUTO_FIX, f"{ports[0]} busy")
    if busy:
        first = busy[0]
        owner = (f" by pid {first['pid']} ({first.get('command', '?')})" if first.get("pid")
                 else " (its owner is not visible to this user)")
        more = f"; also {', '.join(str(b['port']) for b in busy[1:])}" if len(busy) > 1 else ""
        return CheckResult("ports", FAIL, f"port {first['port']} is in use{owner}{more}",
                           AUTO_FIX, f"{first['port']} busy")
    auto = f" ({cluster.auto_note})" if cluster.auto_port else ""
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


def judge_rendezvous(probe: HostProbe, cluster: Cluster) -> CheckResult:
    skipped = not_checked(probe, "rendezvous")
    if skipped:
        return skipped
    master, port = cluster.master_addr, cluster.start_port
    where = f"{master}:{port}"
    n = len(cluster.probes)
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
                                                   f"{listener.get('error')}", AUTO_FIX, "no listen")
        ranks = {a.get("rank") for a in listener.get("accepted", [])}
        expected = n - 1
        if n == 1:
            return CheckResult("rendezvous", PASS, f"listening on :{port} works (single host)",
                               brief=f":{port}")
        return CheckResult("rendezvous", PASS, f"listening on :{port}; "
                                               f"{len(ranks - {None})}/{expected} hosts connected",
                           brief=f":{port} {len(ranks - {None})}/{expected}")
    why = _first_host_unready(cluster)
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
    fixes = {
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
    detail, fix = fixes.get(error, (f"can not connect to {where}: {result.get('text')}",
                                    f"check the network between this host and {master}"))
    return CheckResult("rendezvous", FAIL, detail, fix, error or "failed")


def _first_host_unready(cluster: Cluster) -> Optional[str]:
    """Why the other hosts' connections to the first host prove nothing, if they don't."""
    first = cluster.probes[0]
    if first.ssh_error is not None or first.facts is None:
        return "the first host could not be checked"
    if _is_loopback(cluster.master_addr):
        return f"the first host is named by a loopback address ({cluster.master_addr})"
    listener = first.rendezvous
    if listener is None:
        return first.rendezvous_error or "the first host's listener did not report"
    if not listener.get("listening"):
        return f"the first host could not listen on :{cluster.start_port}"
    return None


def judge_ping(probe: HostProbe, cluster: Cluster) -> CheckResult:
    if len(cluster.probes) == 1:
        return CheckResult("ping", SKIP, "single host", brief="-")
    skipped = not_checked(probe, "ping")
    if skipped:
        return skipped
    ping = probe.fact("ping") or {}
    rtt = ping.get("rtt", {})
    peers = [p for p in cluster.probes if p.host.rank != probe.host.rank]
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


def route_iface(probe: HostProbe) -> Optional[str]:
    net = probe.fact("net") or {}
    return net.get("route_iface")


def judge_iface(probe: HostProbe, cluster: Cluster) -> CheckResult:
    skipped = not_checked(probe, "iface")
    if skipped:
        return skipped
    net = probe.fact("net") or {}
    names = sorted(net.get("interfaces", {}))
    master, found = cluster.master_addr, net.get("route_iface")
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
    loopback = _loopback_hostname(probe, chosen) if len(cluster.probes) > 1 else None
    if loopback:  # alone, every rank is on this machine and loopback is fine
        return loopback
    reference = chosen if probe.host.rank == 0 else (cluster.probes[0].host.iface
                                                     or route_iface(cluster.probes[0]))
    others = {p.host.rank: (p.host.iface or route_iface(p)) for p in cluster.probes}
    others = {r: v for r, v in others.items() if v}
    if reference and chosen != reference and len(set(others.values())) > 1:
        return CheckResult("iface", WARN, f"interface names differ: {groups(others, cluster)}",
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


def judge_data(probe: HostProbe, cluster: Cluster) -> Optional[CheckResult]:
    paths = tuple(dict.fromkeys(tuple(cluster.job.data) + tuple(probe.host.data)))
    if not paths:
        return None
    if probe.data is not None:
        return probe.data
    skipped = not_checked(probe, "data")
    if skipped:
        return skipped
    found = probe.fact("data") or {}
    missing = [p for p in paths if not (found.get(p) or {}).get("exists")]
    if missing:
        return CheckResult("data", FAIL, f"{', '.join(missing)} missing here",
                           "copy the dataset to the same path on every host (rsync -a), or "
                           "mount the shared storage there", "missing")
    return CheckResult("data", PASS, f"{', '.join(paths)} present (contents not compared)",
                       brief="present")


JOB_JUDGES = {"machine": judge_machine, "software": judge_software, "gpus": judge_gpus,
              "ports": judge_ports,
              "rendezvous": judge_rendezvous, "ping": judge_ping, "iface": judge_iface,
              "leftovers": judge_leftovers, "data": judge_data}


def ping_matrix(cluster: Cluster) -> PingMatrix:
    rows: List[Optional[Tuple[Optional[float], ...]]] = []
    for probe in cluster.probes:
        ping = probe.fact("ping") if probe.facts else None
        if not ping or ping.get("method") is None:
            rows.append(None)
            continue
        rtt = ping.get("rtt", {})
        rows.append(tuple(0.0 if other.host.rank == probe.host.rank else rtt.get(other.address)
                          for other in cluster.probes))
    return PingMatrix(tuple(p.host.label for p in cluster.probes), tuple(rows))


def make_cluster(probes: Sequence[HostProbe], job: JobOptions, start_port: Optional[int],
                 master_addr: Optional[str], auto_port: bool = False,
                 auto_note: str = "", known_runs: Optional[Iterable[str]] = None) -> Cluster:
    software = {p.host.rank: parse_software(p.fact("python")) for p in probes
                if p.fact("python") and not p.fact("python").get("error")}
    return Cluster(tuple(probes), job, start_port, master_addr, auto_port, auto_note, software,
                   frozenset(known_runs) if known_runs is not None else None)


def judge(cluster: Cluster) -> Tuple[HostReport, ...]:
    """Every check of every host, in rank order and in the order of CHECKS."""
    reports = []
    repeats = same_machine(cluster)
    for probe in cluster.probes:
        results = []
        for name in CHECKS:
            if name == "ports" and probe.host.rank in repeats:
                # Its ports are its original's: the first host's listener would be
                # reported as a port in use by multihost itself.
                result = CheckResult("ports", SKIP, "not checked: the same machine as "
                                     f"{repeats[probe.host.rank].host.label}", brief="-")
            elif name in HOST_JUDGES:
                result = HOST_JUDGES[name](probe)
            else:
                result = JOB_JUDGES[name](probe, cluster)
            if result is not None:
                results.append(result)
        iface = probe.host.iface or route_iface(probe)
        reports.append(HostReport(probe.host, tuple(results), iface, probe.address))
    return tuple(reports)
