"""``check --collective``, the half that talks to hosts: after the usual checks said
ready, the host-to-host link test (one ``linktest.run`` call per host, all at once,
each walking its column of a round-robin schedule), then the collective job (one
``collective.run`` call per host: the template script with the job's python, gloo on
CPU, NCCL with ``--gpus``). Both calls end with nothing left on the host; every figure a
host sends is checked before it enters the report.
"""
from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .. import helper
from ..errors import MultihostError
from ..fanout import HostGroup
from ..hosts import Host
from ..job import JobOptions
from ..untrusted import clean_report, clean_text
from .collective import (OPS, CollectiveReport, CollectiveRun, HostFacts, LinkMatrix,
                         SizeRow, finite, judge, round_robin)
from .report import CheckReport

LINK_SECONDS = 0.4        # each direction of each pair
LINK_WINDOW = 10.0        # how long a host waits for its peer in one step
SIZE_CAP_S = 2.0          # stop growing a size series once one size takes longer
JOB_TIMEOUT = 120.0       # the collective job, torch's import included
SCRIPT = Path(__file__).resolve().parent / "collective_bench.py"


def run_collective(cluster: HostGroup, job: JobOptions, checked: CheckReport,
                   sizes: Sequence[int], *, link_seconds: float = LINK_SECONDS,
                   job_timeout: float = JOB_TIMEOUT) -> CollectiveReport:
    started = time.monotonic()
    if not checked.ok:
        return CollectiveReport(None, None, (), 0.0,
                                skipped="the checks above failed; fix them first")
    hosts = cluster.hosts
    addresses = [checked.host_report(h).address or h.name for h in hosts]
    links, facts = link_test(cluster, hosts, addresses, checked, link_seconds)
    findings = judge(links, facts)
    twice = bool(findings)
    if twice:
        # Measured again before a host or link is called slow: on a busy machine one
        # test can lose its moment; a link is slow when it is slow both times.
        again, facts = link_test(cluster, hosts, addresses, checked, link_seconds)
        links = links.best_of(again)
        findings = judge(links, facts)
    linked = time.monotonic() - started
    run = collective_job(cluster, job, checked, sizes, job_timeout)
    return CollectiveReport(links, run, findings, time.monotonic() - started,
                            link_duration=linked, measured_twice=twice)


def _each(hosts: Sequence[Host], work) -> Dict[int, object]:
    """``work(host)`` on every host at once (no --fanout bound: the tests need every
    host present together); a host's error becomes its value."""
    results: Dict[int, object] = {}

    def one(host: Host) -> None:
        try:
            results[host.rank] = work(host)
        except MultihostError as err:
            results[host.rank] = err
    threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def link_test(cluster: HostGroup, hosts: Sequence[Host], addresses: Sequence[str],
              checked: CheckReport, seconds: float) -> Tuple[LinkMatrix, List[HostFacts]]:
    n = len(hosts)
    rounds = round_robin(n)
    token = secrets.token_hex(8)
    budget = len(rounds) * (2 * seconds + 2.0) + LINK_WINDOW

    def work(host: Host):
        request = {"rank": host.rank, "addresses": list(addresses),
                   "port": checked.start_port + 1, "seconds": seconds, "window": LINK_WINDOW,
                   "token": token, "schedule": [r[host.rank] for r in rounds],
                   "budget": budget}
        return clean_report(helper.call(cluster.transport(host), "linktest.run", request,
                                        timeout=budget + 15))

    replies = _each(hosts, work)
    return parse_links(hosts, replies, lambda h: h.iface or checked.iface_for(h))


def parse_links(hosts: Sequence[Host], replies: Dict[int, object],
                job_iface) -> Tuple[LinkMatrix, List[HostFacts]]:
    """The matrix and each host's facts from the hosts' replies, every figure checked:
    a peer out of range, a rate that is not a finite positive number, a name with
    escapes, a reply that is not a dict, each costs only its own cell."""
    n = len(hosts)
    rates: List[List[Optional[float]]] = [[None] * n for _ in range(n)]
    ifaces: List[List[Optional[str]]] = [[None] * n for _ in range(n)]
    errors, facts = [], []
    for host in hosts:
        k = host.rank
        reply = replies.get(k)
        if not isinstance(reply, dict):
            errors.append(f"{host.label}: {reply.cause if isinstance(reply, MultihostError) else 'no reply'}")
            facts.append(HostFacts(iface_job=job_iface(host)))
            continue
        used = set()
        pairs = reply.get("pairs") if isinstance(reply.get("pairs"), list) else []
        for entry in pairs[:4096]:
            peer = entry.get("peer") if isinstance(entry, dict) else None
            if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < n \
                    or peer == k:
                continue
            iface = entry.get("iface")
            if isinstance(iface, str):
                ifaces[k][peer] = clean_text(iface, 32)
                used.add(ifaces[k][peer])
            # What this host received from the peer is the peer's row; what it sent
            # (as counted by the peer) is its own: both ends agree on each figure.
            for role, (i, j) in (("sent", (k, peer)), ("received", (peer, k))):
                rate = _rate(entry.get(role))
                if rate is not None and rates[i][j] is None:
                    rates[i][j] = rate
                elif rate is None and isinstance(entry.get(role), dict) and entry[role].get("error"):
                    errors.append(f"{host.label} {role} {'to' if role == 'sent' else 'from'} "
                                  f"{hosts[peer].label}: {clean_text(entry[role]['error'], 120)}")
        speeds = reply.get("speeds") if isinstance(reply.get("speeds"), dict) else {}
        first = sorted(used)[0] if used else None
        speed = speeds.get(first) if first else None
        facts.append(HostFacts(
            iface_used=first, iface_job=job_iface(host),
            speed_mbit=int(speed) if finite(speed) else None,
            load=finite(reply.get("load")),
            cpus=int(reply["cpus"]) if finite(reply.get("cpus")) else None))
    matrix = LinkMatrix(tuple(h.label for h in hosts),
                        tuple(tuple(row) for row in rates), tuple(tuple(row) for row in ifaces),
                        tuple(errors))
    return matrix, facts


def _rate(figure: object) -> Optional[float]:
    if not isinstance(figure, dict):
        return None
    size, seconds = finite(figure.get("bytes")), finite(figure.get("seconds"))
    if not size or not seconds:
        return None
    return size * 8 / seconds


def collective_job(cluster: HostGroup, job: JobOptions, checked: CheckReport,
                   sizes: Sequence[int], timeout: float) -> CollectiveRun:
    hosts = cluster.hosts
    gpus = {h.rank: list(job.gpus_for(h)) for h in hosts}
    backend = "nccl" if any(gpus.values()) else "gloo"
    nproc = {h.rank: len(gpus[h.rank]) or 1 for h in hosts}
    world = sum(nproc.values())
    offsets, offset = {}, 0
    for host in hosts:
        offsets[host.rank] = offset
        offset += nproc[host.rank]
    script = SCRIPT.read_bytes()
    args = ["--sizes", ",".join(str(s) for s in sizes), "--backend", backend,
            "--ops", ",".join(OPS), "--cap", str(SIZE_CAP_S)]

    def work(host: Host):
        request = {"args": args, "nproc": nproc[host.rank], "rank_offset": offsets[host.rank],
                   "world_size": world, "master_addr": checked.master_addr,
                   "master_port": checked.start_port, "gpus": gpus[host.rank],
                   "iface": host.iface or checked.iface_for(host), "timeout": timeout}
        return clean_report(helper.call(cluster.transport(host), "collective.run", request,
                                        input=script, timeout=timeout + 15))

    replies = _each(hosts, work)
    return parse_run(hosts, replies, backend, world, sizes)


def parse_run(hosts: Sequence[Host], replies: Dict[int, object], backend: str, world: int,
              sizes: Sequence[int]) -> CollectiveRun:
    """The figures of the host that printed them (rank 0's), checked; or the first
    failure, named by host."""
    result, problems = None, []
    for host in hosts:
        reply = replies.get(host.rank)
        if isinstance(reply, MultihostError):
            problems.append(f"{host.label}: {reply.cause}")
            continue
        if not isinstance(reply, dict):
            problems.append(f"{host.label}: no reply")
            continue
        if reply.get("timed_out"):
            problems.append(f"{host.label}: the job did not end in time (a peer unreachable "
                            "on the job's ports, or a stuck rank)")
        for failed in reply.get("failed") or []:
            if isinstance(failed, dict):
                tail = [l for l in str(failed.get("tail", "")).splitlines() if l.strip()]
                problems.append(f"{host.label}: rank exited {failed.get('exit')}: "
                                f"{clean_text(tail[-1], 200) if tail else 'no output'}")
        if isinstance(reply.get("result"), dict) and result is None:
            result = reply["result"]
    if result is None:
        return CollectiveRun(backend, world, "", (), (),
                             problems[0] if problems else "the job printed no figures")
    rows, capped = [], []
    ops = result.get("ops") if isinstance(result.get("ops"), dict) else {}
    for op in OPS:
        data = ops.get(op) if isinstance(ops.get(op), dict) else {}
        got = 0
        for row in (data.get("rows") or [])[:64]:
            if not isinstance(row, dict):
                continue
            size, seconds, iters = (finite(row.get(k)) for k in ("bytes", "seconds", "iters"))
            if size and seconds and iters:
                rows.append(SizeRow(op, int(size), seconds, int(iters), world))
                got += 1
        stop = finite(data.get("capped_at"))
        if stop and got < len(sizes):
            capped.append((op, int(stop)))
    version = clean_text(result.get("torch", ""), 40)
    timings = tuple((name, finite(result.get(name + "_s"))) for name in ("import", "init", "measure"))
    return CollectiveRun(backend, world, version, tuple(rows), tuple(capped),
                         timings=tuple((n, v) for n, v in timings if v is not None))
