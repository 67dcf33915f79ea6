"""What the user wrote to name the hosts, read and checked: the items of ``--ips`` and the
lines of a hostfile (ours: ``[defaults]`` then a ``[HOST]`` section per machine; or
``NAME slots=N`` lines as DeepSpeed, Open MPI and Horovod write them) become one dict
per host, in the order given, every value checked (port, GPU ids, user, slots, spare).
Every parse error names the item or the hostfile line, the cause and the fix. hosts.py
makes the Host records of them.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .errors import ConfigError, quoted
from .userfiles import read_config_text

HOST_KEYS = ("user", "port", "identity_file", "workdir", "python", "gpus", "iface", "data",
             "slots", "launcher", "spare")
# `NAME slots=N`, one host per line: the hostfile of DeepSpeed, Open MPI and Horovod.
_SLOTS_LINE = re.compile(r"^(\S+)\s+slots\s*=\s*(\S+)$")
_OTHER_LAUNCHER_LINE = re.compile(r"^(\S+)\s+(max_slots|max-slots|slots|cpu|gpu)\S*")


def parse_port(text: str, where: str) -> int:
    try:   # int() takes any script's digits: only ASCII ones are a port
        port = int(text) if text.strip().isascii() else -1
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise ConfigError(f"{where}: port {quoted(text)} is not a number from 1 to 65535",
                          fix="give a port like 22 or 2222")
    return port


def parse_gpu_ids(text: str, where: str) -> Tuple[int, ...]:
    """``--gpus``/``gpus =`` as typed (``0-3``, ``0,2``, ``cpu``) into device ids; what a
    host's ``nvidia-smi`` reports is ``check.parsers.parse_gpus``'s."""
    text = text.strip()
    if text.lower() in ("", "none", "cpu"):
        return ()
    gpus: List[int] = []
    for item in text.split(","):
        item = item.strip()
        low, dash, high = item.partition("-")  # 0-3: the range multihost itself prints
        if not (low.strip().isascii() and low.strip().isdigit()) or \
                (dash and not (high.strip().isascii() and high.strip().isdigit())):
            raise ConfigError(f"{where}: gpu {item!r} is not a device index",
                              fix="list device indexes like 0,1,2,3 or 0-3 (or 'none' for CPU)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first or last - first > 1024:
            raise ConfigError(f"{where}: gpu range {item!r} is backwards or too large",
                              fix="write a range low to high, e.g. 0-3")
        for index in range(first, last + 1):
            if index in gpus:
                raise ConfigError(f"{where}: gpu {index} is listed twice",
                                  fix="list each device once")
            gpus.append(index)
    return tuple(gpus)


def parse_spare_flag(text: str, where: str) -> bool:
    """The hostfile's ``spare = true`` (or 1, yes, on; false, 0, no, off)."""
    value = text.strip().lower()
    if value in ("true", "yes", "on", "1"):
        return True
    if value in ("false", "no", "off", "0"):
        return False
    raise ConfigError(f"{where}: spare {text!r} is not true or false",
                      fix="write spare = true for a spare host (or remove the line)")


def parse_slots(text: str, where: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= 1024:
        raise ConfigError(f"{where}: slots {text!r} is not a number of processes from 1 to 1024",
                          fix="write NAME slots=N, e.g. worker-1 slots=4")
    return int(text)


def parse_host_item(item: str, where: str) -> Tuple[str, Optional[str], Optional[int]]:
    """``[user@]host[:port]``, ``[user@][v6addr]:port`` or a bare IPv6 address."""
    original = item
    if not item.isascii():
        # Fullwidth digits ('１９８.18.0.11') resolve to the address they look like, and
        # the host key would be recorded under the look-alike name.
        odd = next(ch for ch in item if not ch.isascii())
        raise ConfigError(f"{where}: host {quoted(original)} has a character that is not "
                          f"ASCII ({odd!r}, U+{ord(odd):04X})",
                          fix="type the name or address in ASCII (an international name in "
                              "its xn-- form)")
    if item != item.strip() or any(ch.isspace() for ch in item):
        fix = ("separate hosts with commas only, e.g. --ips=10.0.0.1,10.0.0.2"
               if where.startswith("--ips") else "one host per section, e.g. [10.0.0.1]")
        raise ConfigError(f"{where}: host {quoted(original)} contains white space", fix=fix)
    if not item:
        raise ConfigError(f"{where}: empty host name",
                          fix="remove the extra comma, e.g. --ips=10.0.0.1,10.0.0.2")
    user = None
    if "@" in item:
        user, item = item.rsplit("@", 1)
        if not user or not item:
            raise ConfigError(f"{where}: {quoted(original)} is not user@host", fix="write user@host")
        check_user(user, where)
    port = None
    if item.startswith("["):
        end = item.find("]")
        if end < 0:
            raise ConfigError(f"{where}: {quoted(original)} has '[' without ']'",
                              fix="write an IPv6 address with a port as [fe80::1]:22")
        name, rest = item[1:end], item[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"{where}: unexpected {rest!r} after ']' in {quoted(original)}",
                                  fix="write [address]:port")
            port = parse_port(rest[1:], where)
        _require_ipv6(name, original, where)
    elif item.count(":") > 1:
        name = item  # a bare IPv6 address can carry no port
        _require_ipv6(name, original, where)
    elif ":" in item:
        name, port_text = item.split(":", 1)
        port = parse_port(port_text, where)
    else:
        name = item
    if not name or name.startswith("-") or not all(ch.isalnum() or ch in "._-:%" for ch in name):
        raise ConfigError(f"{where}: {quoted(original)} is not a host name or address",
                          fix="use a name, an IPv4 address, or [IPv6]:port")
    return name, user, port


def check_user(user: str, where: str) -> None:
    """A login name: ssh would read one starting with '-' as an option."""
    if not user or user.startswith("-") or not user.isascii() or \
            not all(ch.isalnum() or ch in "._-$@\\" for ch in user):
        raise ConfigError(f"{where}: {quoted(user)} is not a user name",
                          fix="give the login name on the host, e.g. root or ubuntu")


def _require_ipv6(name: str, original: str, where: str) -> None:
    import ipaddress  # here: every command starts by reading hosts, few have IPv6 ones

    try:
        ipaddress.IPv6Address(name.split("%", 1)[0])
    except ValueError:
        raise ConfigError(f"{where}: {quoted(original)} is not a valid IPv6 address",
                          fix="check the address, and bracket it with a port: [fe80::1]:22") from None


def parse_ips(text: str) -> List[Dict[str, object]]:
    """``--ips`` into one dict of fields per host, in the given order."""
    if not text.strip():
        raise ConfigError("--ips is empty", fix="list hosts like --ips=10.0.0.1,10.0.0.2")
    entries = []
    for index, item in enumerate(text.split(","), start=1):
        name, user, port = parse_host_item(item, f"--ips item {index}")
        entries.append({"name": name, "user": user, "port": port, "_where": f"--ips item {index}"})
    return entries


MAX_HOSTS = 4096   # in one command: more is a wrong file, not a cluster


def check_host_count(count: int, where: str) -> None:
    if count > MAX_HOSTS:
        raise ConfigError(f"{where}: {count} hosts, more than {MAX_HOSTS} hosts multihost "
                          "takes in one command", fix="check that this is the right hostfile, "
                          "or split the hosts over several commands")


def parse_hostfile(path: Path) -> List[Dict[str, object]]:
    """A hostfile into one dict per host (the defaults section already merged in)."""
    text = read_config_text(path, "hostfile", "--hostfile")
    defaults: Dict[str, object] = {}
    hosts: List[Dict[str, object]] = []
    section: Optional[Dict[str, object]] = None
    sections_seen = False
    for lineno, raw in enumerate(text.splitlines(), start=1):
        where = f"{path}:{lineno}"
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            sections_seen = True
            if not line.endswith("]") or len(line) < 3:
                raise ConfigError(f"{where}: bad section {line!r}",
                                  fix="write [defaults] or [HOST], one per line")
            title = line[1:-1].strip()
            if title == "defaults":
                if hosts:
                    raise ConfigError(f"{where}: [defaults] must come before the hosts",
                                      fix="move the [defaults] section to the top")
                section = defaults
            else:
                name, user, port = parse_host_item(title, where)
                section = {"name": name, "user": user, "port": port, "_where": where}
                hosts.append(section)
            continue
        entry = _launcher_line(line, where, bare_names=not sections_seen)
        if entry is not None:  # a host as other launchers write it; ends any section
            hosts.append(entry)
            section = None
            continue
        if "=" not in line:
            raise ConfigError(f"{where}: expected 'key = value', got {line!r}",
                              fix=f"keys are: {', '.join(HOST_KEYS)}")
        if section is None:
            raise ConfigError(f"{where}: {line!r} is outside any section",
                              fix="put it under [defaults] or under a [HOST] section")
        key, value = (part.strip() for part in line.split("=", 1))
        if key not in HOST_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}", fix=f"keys are: {', '.join(HOST_KEYS)}")
        if key == "launcher" and section is not defaults:
            # One job has one launcher: a per-host one would start half of it wrongly.
            raise ConfigError(f"{where}: launcher is set for the whole job",
                              fix="move the launcher line to [defaults]")
        if key == "spare" and section is defaults:
            raise ConfigError(f"{where}: spare is set per host, not in [defaults]",
                              fix="put spare = true under the [HOST] section of each spare")
        section[key] = _parse_value(key, value, where, section.get(key))
    if not hosts:
        raise ConfigError(f"{path}: no hosts", fix="add one [HOST] section per machine")
    merged = []
    for host in hosts:
        entry = dict(defaults)
        entry.update({k: v for k, v in host.items() if v is not None})
        if "data" in defaults and "data" in host:
            entry["data"] = tuple(defaults["data"]) + tuple(host["data"])  # type: ignore[arg-type]
        merged.append(entry)
    return merged


def _launcher_line(line: str, where: str, bare_names: bool) -> Optional[Dict[str, object]]:
    """``NAME slots=N`` (DeepSpeed, Open MPI, Horovod): a host running N processes; a bare
    ``NAME`` before any section: one host (an MPI machinefile). Other launchers' options
    (``max_slots``...) are refused with the hint, never silently dropped."""
    line = line.split("#", 1)[0].strip()
    match = _SLOTS_LINE.match(line)
    if match:
        name, user, port = parse_host_item(match.group(1), where)
        return {"name": name, "user": user, "port": port, "_where": where,
                "slots": parse_slots(match.group(2), where)}
    other = _OTHER_LAUNCHER_LINE.match(line)
    if other and "=" not in other.group(1):
        raise ConfigError(f"{where}: {line!r} uses launcher options multihost does not read",
                          fix="write NAME slots=N (N processes on that host), or an INI "
                              "section [NAME] with gpus = 0-3")
    if bare_names and "=" not in line:
        name, user, port = parse_host_item(line, where)
        return {"name": name, "user": user, "port": port, "_where": where}
    return None


def _parse_value(key: str, value: str, where: str, previous: object) -> object:
    if key == "port":
        return parse_port(value, where)
    if key == "gpus":
        return parse_gpu_ids(value, where)
    if key == "slots":
        return parse_slots(value, where)
    if key == "spare":
        return parse_spare_flag(value, where)
    if key == "data":  # repeatable, and comma-separated
        paths = tuple(p.strip() for p in value.split(",") if p.strip())
        return tuple(previous or ()) + paths  # type: ignore[arg-type]
    if not value:
        raise ConfigError(f"{where}: {key} is empty", fix=f"give a value or remove the {key} line")
    if key == "user":
        check_user(value, where)
    return value
