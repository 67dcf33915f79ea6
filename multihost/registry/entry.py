"""A run as the other users of its hosts see it: its entry in each host's registry
(remote/registry/holds.py), and the name people call it by.
"""
from __future__ import annotations

import getpass
import re
import socket
from typing import Any, Dict

from ..errors import ConfigError, quoted

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$")


def check_name(name: str) -> str:
    """``--name``: a word people can type (it stands where a run id does)."""
    if name and not NAME_RE.fullmatch(name):
        raise ConfigError(f"--name {quoted(name)} is not a plain word",
                          fix="start with a letter; then letters, digits, '.', '_' or '-' "
                              "(at most 64), e.g. --name bert-large")
    return name


def controller() -> str:
    """Who started it, from where: what another user needs to ask them."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


def hold_request(plan, node) -> Dict[str, Any]:
    """What this node's host registry records of the run while it holds the host."""
    return {"name": getattr(plan, "name", "") or "", "controller": controller(),
            "gpus": list(node.gpus) if node.gpus else None,
            "ports": list(range(plan.start_port, plan.start_port + node.nproc + 1)),
            "hosts": [n.host.label for n in plan.nodes]}
