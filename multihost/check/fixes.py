"""Fix lines that work when followed literally.

Every fix a check prints is made of actions, each with its words in backquotes:

    run `multihost sync --ips=a,b --data /data --sync-data --no-code`   a command to type here
    add `--start-port auto`                  flags to add to the command that was checked
    drop `--gpus`                            a flag (and its value) to take out of it
    run `unset CUDA_VISIBLE_DEVICES`         a shell builtin, in the shell that runs multihost

Alternatives are joined by ", or "; the first is the one that needs nothing more. A
command names the hosts as the user gave them (``given``: ``--ips=...`` or
``--hostfile ...`` with the ssh flags), so that typed as shown it reaches the same hosts:
without them ``multihost sync`` would run on this machine alone.
"""
from __future__ import annotations

import re
import shlex
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from ..hosts import IN_PLACE, Host

# The flags that say which hosts and how to reach them, as add_host_options names them.
_HOST_FLAGS = (("ips", "--ips"), ("hostfile", "--hostfile"), ("include", "--include"),
               ("exclude", "--exclude"), ("user", "--user"), ("port", "--port"),
               ("identity", "-i"), ("workdir", "--workdir"), ("python", "--python"))


def given_flags(values: Mapping[str, Any]) -> str:
    """The host options of a command line (``values`` by each flag's dest), quoted for a
    shell: what a fix's command needs to reach the same hosts (``--ips`` kept as
    ``--ips=...``, as users type it)."""
    words = []
    for dest, flag in _HOST_FLAGS:
        value = values.get(dest)
        if value is None:
            continue
        words.append(f"--ips={shlex.quote(value)}" if flag == "--ips"
                     else f"{flag} {shlex.quote(str(value))}")
    config = values.get("ssh_config")
    if config and config != "~/.ssh/config":
        words.append(f"-F {shlex.quote(config)}")
    return " ".join(words)


def hosts_flags(hosts: Sequence[Host]) -> str:
    """The same hosts as ``--ips`` and flags, for callers that only have the hosts (the
    Python API, a run's preflight): a single entry on this machine is the default."""
    if len(hosts) == 1 and hosts[0].name in ("127.0.0.1", "localhost") and not hosts[0].user \
            and not hosts[0].port:
        words = []
    else:
        words = ["--ips=" + ",".join(_item(h) for h in hosts)]
    here = {None, IN_PLACE} if not words else {None}   # alone, the job runs in place
    for field, flag, defaults in (("python", "--python", {"python3"}), ("workdir", "--workdir", here),
                                  ("identity_file", "-i", {None})):
        values = {getattr(h, field) for h in hosts}
        if len(values) == 1 and not values <= defaults:
            words.append(f"{flag} {shlex.quote(str(values.pop()))}")
    return " ".join(words)


def _item(host: Host) -> str:
    name = f"[{host.name}]" if ":" in host.name and host.port else host.name
    user = f"{host.user}@" if host.user else ""
    port = f":{host.port}" if host.port and host.port != 22 else ""
    return f"{user}{name}{port}"


def multihost(command: str, given: str, *words: str) -> str:
    """``multihost COMMAND <the hosts as given> WORDS``, quoted for a shell."""
    rest = " ".join(shlex.quote(w) for w in words)
    return " ".join(part for part in ("multihost", command, given, rest) if part)


def on_host(given: str, host: Host, *argv: str) -> str:
    """A command run on one host from here: ``multihost exec`` with the hosts as given
    and ``--include`` naming that one (the exec reaches it as the check did)."""
    return multihost("exec", given, "--include", host.label, "--", *argv)


def run(command: str) -> str:
    return f"run `{command}`"


def add(*flags: str) -> str:
    return f"add `{' '.join(flags)}`"


def drop(flag: str) -> str:
    return f"drop `{flag}`"


def quoted(value: Optional[str]) -> str:
    return shlex.quote(value or "")


_ACTION = re.compile(r"\b(run|add|drop) `([^`]+)`")


def actions(fix: str) -> List[Tuple[str, str]]:
    """The first alternative of a fix as its actions, [(verb, words)] in order: what
    following it literally means (the lab's tests follow every fix this way)."""
    return _ACTION.findall(fix.split(", or ")[0])
