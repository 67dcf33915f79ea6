"""Network namespaces and links of a lab, through iproute2.

The switch is a bridge in the controller namespace; each host hangs off it by a veth
pair that is created with both ends already inside their namespaces, so no lab link,
address or route ever exists in the root namespace (traffic can not leave the machine).
"""
from __future__ import annotations

import json
import os
import subprocess
from typing import Dict, List, Optional, Sequence

from ..errors import LabError
from .config import (BRIDGE, CTL_ADDRESS, HOST_IFACE, PREFIX_LEN, bridge_port, ctl_netns,
                     host_address, host_mac, host_netns, neighbour_lines, netns_pattern)

NETNS_DIR = "/run/netns"


def _run(argv: Sequence[str], script: Optional[str] = None) -> subprocess.Popen:
    return subprocess.Popen(list(argv), stdin=subprocess.PIPE if script else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(procs: List[subprocess.Popen], scripts: List[Optional[str]], what: str) -> None:
    errors = []
    for proc, script in zip(procs, scripts):
        _, err = proc.communicate(script, timeout=60)
        if proc.returncode != 0:
            errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}")
    if errors:
        raise LabError(f"{what} failed: {errors[0]}",
                       fix="run `multihost lab down` and retry; check that iproute2 works as root")


def run_batches(batches: Sequence[Sequence[str]], what: str) -> None:
    """Run several `ip -b -` style commands (argv, script) at once and wait for all."""
    procs, scripts = [], []
    for argv, script in batches:
        procs.append(_run(argv, script))
        scripts.append(script)
    _finish(procs, scripts, what)


def create(name: str, n: int, rate: Optional[str] = None, burst: int = 0) -> None:
    """Build the namespaces, the bridge and one veth pair per host, all up."""
    ctl = ctl_netns(name)
    # One root-namespace batch: `netns add` for all, then every veth pair, each end born
    # in its namespace (`link add X netns A type veth peer name Y netns B`).
    lines = [f"netns add {ctl}"] + [f"netns add {host_netns(name, i)}" for i in range(1, n + 1)]
    lines += [f"link add {bridge_port(i)} netns {ctl} type veth peer name {HOST_IFACE} "
              f"netns {host_netns(name, i)} address {host_mac(i)}" for i in range(1, n + 1)]
    run_batches([(["ip", "-b", "-"], "\n".join(lines) + "\n")], "creating the lab namespaces")

    ctl_lines = ["link set lo up", f"link add {BRIDGE} address {host_mac(0)} type bridge",
                 f"addr add {CTL_ADDRESS}/{PREFIX_LEN} dev {BRIDGE}", f"link set {BRIDGE} up"]
    for i in range(1, n + 1):
        ctl_lines += [f"link set {bridge_port(i)} master {BRIDGE}", f"link set {bridge_port(i)} up"]
    ctl_lines += neighbour_lines(n, 0, BRIDGE)
    batches = [(["ip", "-n", ctl, "-b", "-"], "\n".join(ctl_lines) + "\n")]
    for i in range(1, n + 1):
        host_lines = ["link set lo up", f"addr add {host_address(i)}/{PREFIX_LEN} dev {HOST_IFACE}",
                      f"link set {HOST_IFACE} up", *neighbour_lines(n, i, HOST_IFACE)]
        batches.append((["ip", "-n", host_netns(name, i), "-b", "-"], "\n".join(host_lines) + "\n"))
    if rate:
        # Shape both directions: the host's egress on eth0, its ingress on the bridge port,
        # and the controller's own port (the bridge), so the controller has one uplink of
        # that rate like a real machine, shared by everything it sends at once.
        tbf = f"root tbf rate {rate} burst {burst} latency 50ms"
        batches.append((["tc", "-n", ctl, "-b", "-"], "".join(
            f"qdisc replace dev {bridge_port(i)} {tbf}\n" for i in range(1, n + 1))
            + f"qdisc replace dev {BRIDGE} {tbf}\n"))
        batches += [(["tc", "-n", host_netns(name, i), "-b", "-"],
                     f"qdisc replace dev {HOST_IFACE} {tbf}\n") for i in range(1, n + 1)]
    run_batches(batches, "configuring the lab links")


def lab_namespaces(name: str) -> List[str]:
    """Every namespace of lab ``name`` that exists, whether the lab is whole or half-built."""
    try:
        entries = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    pattern = netns_pattern(name)
    return sorted(e for e in entries if pattern.match(e))


def netns_path(ns: str) -> str:
    return os.path.join(NETNS_DIR, ns)


def delete(namespaces: Sequence[str]) -> None:
    if not namespaces:
        return
    script = "".join(f"netns del {ns}\n" for ns in namespaces)
    # -force: go on past a namespace already gone, so a half-built lab still comes down.
    proc = _run(["ip", "-force", "-b", "-"], script)
    _, err = proc.communicate(script, timeout=60)
    left = [ns for ns in namespaces if os.path.exists(netns_path(ns))]
    if left:
        raise LabError(f"could not delete namespace {left[0]}: {err.strip()}",
                       fix=f"run `ip netns del {left[0]}` as root")


def set_link(name: str, n: int, i: int, up: bool) -> None:
    """Cut (down) or heal (up) host i's cable, at both ends."""
    state = "up" if up else "down"
    # Taking eth0 down flushes its neighbour table, permanent entries included: a heal
    # writes it again, as `create` did.
    host_lines = [f"link set {HOST_IFACE} {state}", *(neighbour_lines(n, i, HOST_IFACE) if up else [])]
    ends = [(["ip", "-n", ctl_netns(name), "link", "set", bridge_port(i), state], None),
            (["ip", "-n", host_netns(name, i), "-b", "-"], "\n".join(host_lines) + "\n")]
    run_batches(ends, f"setting host {i}'s link {state}")


def shape(name: str, i: int, rate: Optional[str], burst: int) -> None:
    """Shape host i's link at both ends (its egress on eth0, its ingress on the bridge
    port), or lift the shaping (``rate`` None)."""
    verb = f"replace dev {{dev}} root tbf rate {rate} burst {burst} latency 50ms" if rate \
        else "del dev {dev} root"
    ends = [(["tc", "-n", ctl_netns(name), "qdisc", *verb.format(dev=bridge_port(i)).split()], None),
            (["tc", "-n", host_netns(name, i), "qdisc", *verb.format(dev=HOST_IFACE).split()], None)]
    if rate:
        run_batches(ends, f"shaping host {i}'s link")
        return
    for argv, _ in ends:  # an end never shaped has nothing to lift: not an error
        _run(argv).communicate(timeout=60)


def link_states(name: str, n: int) -> Dict[int, bool]:
    """For each host: is its cable up at both ends (admin state)?"""
    procs = {0: _run(["ip", "-j", "-n", ctl_netns(name), "link", "show"])}
    for i in range(1, n + 1):
        procs[i] = _run(["ip", "-j", "-n", host_netns(name, i), "link", "show", HOST_IFACE])
    up_ifaces: Dict[int, set] = {}
    for key, proc in procs.items():
        out, _ = proc.communicate(timeout=30)
        try:
            links = json.loads(out) if proc.returncode == 0 else []
        except ValueError:
            links = []
        up_ifaces[key] = {l.get("ifname") for l in links if "UP" in l.get("flags", [])}
    return {i: bridge_port(i) in up_ifaces[0] and HOST_IFACE in up_ifaces[i]
            for i in range(1, n + 1)}
