"""`multihost lab status`: one line per host of the lab, and Slurm's nodes where it runs."""
from __future__ import annotations

from typing import IO, Mapping, Sequence

HEADERS = ("HOST", "ADDRESS", "INIT PID", "SSHD", "LINK")


def status_rows(hosts: Sequence) -> list:
    """The table's rows (``lab.HostStatus`` records), under HEADERS."""
    return [(h.name, h.address, str(h.pid) if h.pid else "dead",
             "up" if h.sshd else "down", "up" if h.link else "cut") for h in hosts]


def render_status(name: str, where: str, hostfile: str, hosts: Sequence,
                  slurm_nodes: Mapping[str, str], out: IO[str]) -> None:
    """The lab's header line, its hosts' table, then Slurm's nodes and their states."""
    table = [HEADERS] + status_rows(hosts)
    widths = [max(len(row[c]) for row in table) for c in range(len(HEADERS))]
    out.write(f"lab {name} at {where}  (hostfile {hostfile})\n")
    for row in table:
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")
    if slurm_nodes:
        out.write("slurm: " + ", ".join(f"{node} {state}"
                                        for node, state in slurm_nodes.items()) + "\n")
