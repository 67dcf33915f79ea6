"""Host-key verification the way OpenSSH does it, which fabric does not (deps notes).

Known keys come from the files the user's ssh reads: ``UserKnownHostsFile`` from
ssh_config, else ``~/.ssh/known_hosts`` (and ``known_hosts2``), plus the system-wide
``/etc/ssh/ssh_known_hosts``. An unknown key is refused unless the user asked for
accept-new, in which case it is appended to the user's known_hosts; a changed key is
always refused (paramiko raises BadHostKeyException before any policy is asked).

Marker lines, which paramiko cannot read (it stops with InvalidHostKey), are read here:
a key listed ``@revoked`` is never accepted, for any host (stricter than OpenSSH, which
looks only at the lines naming the host) and even with accept-new; a host whose key is
unknown but certified by a CA listed ``@cert-authority`` for it is accepted after its
certificate is checked (hostcerts.py), and never recorded, as OpenSSH does. A line that
does not parse is skipped, as OpenSSH skips it.
"""
from __future__ import annotations

import base64
import binascii
import os
import threading
from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple

import paramiko

from .hostcerts import certificate_problem, host_matches

SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
_record_lock = threading.Lock()


def _paths(value: Optional[object]) -> List[str]:
    if isinstance(value, str):
        return value.split()
    return list(value) if value else []  # type: ignore[arg-type]


def known_hosts_files(user_known_hosts: Optional[object] = None,
                      global_known_hosts: Optional[object] = None) -> List[str]:
    """The files to trust (ssh_config's UserKnownHostsFile and GlobalKnownHostsFile, or
    OpenSSH's defaults), the first being where accepted keys are recorded."""
    user_files = _paths(user_known_hosts) or ["~/.ssh/known_hosts", "~/.ssh/known_hosts2"]
    global_files = _paths(global_known_hosts) or [SYSTEM_KNOWN_HOSTS]
    return [os.path.expanduser(p) for p in user_files + global_files if p != "/dev/null"] \
        or [os.path.expanduser("~/.ssh/known_hosts")]


@dataclass(frozen=True)
class KnownHosts:
    """What the known_hosts files say: plain entries (revoked keys left out), the CAs
    with the host patterns they sign for, and the revoked keys (their wire bytes)."""

    plain: Tuple[paramiko.hostkeys.HostKeyEntry, ...] = ()
    authorities: Tuple[Tuple[str, paramiko.PKey], ...] = ()
    revoked: Tuple[bytes, ...] = ()

    def authorities_for(self, name: str) -> List[paramiko.PKey]:
        return [key for patterns, key in self.authorities if host_matches(patterns, name)]

    def fill(self, keys: paramiko.HostKeys) -> None:
        """Put the plain entries into paramiko's table; the first line for a name and
        key type wins, as in OpenSSH."""
        for entry in self.plain:
            for name in entry.hostnames:
                known = keys.lookup(name)
                if known is None or entry.key.get_name() not in known:
                    keys.add(name, entry.key.get_name(), entry.key)


def _marked_key(fields: List[str]) -> Optional[paramiko.PKey]:
    """The key of ``@marker patterns type base64``, or None when it does not parse."""
    if len(fields) < 4:
        return None
    try:
        return paramiko.PKey.from_type_string(fields[2], base64.b64decode(fields[3]))
    except (binascii.Error, ValueError, paramiko.SSHException):
        return None


def load_known_hosts(paths: Iterable[str]) -> KnownHosts:
    plain, authorities, revoked = [], [], []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as lines:
                text = lines.read().splitlines()
        except OSError:  # absent or unreadable: like ssh, go on with the others
            continue
        for number, line in enumerate(text, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            if fields[0] in ("@cert-authority", "@revoked"):
                key = _marked_key(fields)
                if key is not None and fields[0] == "@revoked":
                    revoked.append(key.asbytes())
                elif key is not None:
                    authorities.append((fields[1], key))
                continue
            if line.startswith("@"):
                continue  # a marker this version does not know: never trusted
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(" ".join(fields[:3]), number)
            except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError):
                entry = None
            if entry is not None and entry.key is not None:
                plain.append(entry)
    gone = set(revoked)
    return KnownHosts(tuple(e for e in plain if e.key.asbytes() not in gone),
                      tuple(authorities), tuple(revoked))


class UnknownHostKey(Exception):
    def __init__(self, name: str, key: paramiko.PKey, why: Optional[str] = None):
        super().__init__(name)
        self.name = name
        self.fingerprint = f"{key.get_name()} {key.fingerprint}"
        self.why = why  # set when a CA is listed for the host but its certificate fails


class RevokedHostKey(Exception):
    def __init__(self, name: str, key: paramiko.PKey):
        super().__init__(name)
        self.name = name
        self.fingerprint = f"{key.get_name()} {key.fingerprint}"


def is_revoked(known: KnownHosts, key: paramiko.PKey) -> bool:
    return key.asbytes() in set(known.revoked)


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or (accept-new) record them like StrictHostKeyChecking=accept-new;
    refuse revoked keys always; accept a key certified for ``host`` by a listed CA."""

    def __init__(self, accept_new: bool, record_file: str, known: KnownHosts = KnownHosts(),
                 host: str = ""):
        self.accept_new = accept_new
        self.record_file = record_file
        self.known = known
        self.host = host

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if is_revoked(self.known, key):
            raise RevokedHostKey(hostname, key)
        authorities = self.known.authorities_for(hostname)
        why = None
        if authorities:
            why = certificate_problem(key, self.host or hostname, authorities, self.known.revoked)
            if why is None:
                return  # certified: trusted through its CA, never recorded
        if not self.accept_new:
            raise UnknownHostKey(hostname, key, why)
        client.get_host_keys().add(hostname, key.get_name(), key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _record_lock:
            directory = os.path.dirname(self.record_file)
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = os.open(self.record_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as out:
                out.write(line)
