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

from ._paramiko import paramiko
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
class KnownLine:
    """A plain known_hosts line, its key still in wire bytes: only the lines of the
    host being connected to are turned into keys."""

    patterns: str
    key_type: str
    blob: bytes


@dataclass(frozen=True)
class KnownHosts:
    """What the known_hosts files say: plain lines (revoked keys left out), the CAs
    with the host patterns they sign for, and the revoked keys (their wire bytes)."""

    plain: Tuple[KnownLine, ...] = ()
    authorities: Tuple[Tuple[str, paramiko.PKey], ...] = ()
    revoked: Tuple[bytes, ...] = ()

    def authorities_for(self, name: str) -> List[paramiko.PKey]:
        return [key for patterns, key in self.authorities if host_matches(patterns, name)]

    def fill(self, keys: paramiko.HostKeys, name: str) -> None:
        """Put the keys known for ``name`` (as known_hosts names it: ``[host]:port`` off
        port 22) into paramiko's table; the first line for a key type wins, and lines
        name hosts by pattern or hash, as in OpenSSH. Only this host's: one pass over
        the files (paramiko's own loading costs a pass per line: 40 s for 5,000 lines)."""
        taken = set()
        for line in self.plain:
            if line.key_type in taken or not host_matches(line.patterns, name):
                continue
            key = _key(line.key_type, line.blob)
            if key is not None:
                taken.add(line.key_type)
                keys.add(name, key.get_name(), key)


def _key(key_type: str, blob: bytes) -> Optional[paramiko.PKey]:
    try:
        return paramiko.PKey.from_type_string(key_type, blob)
    except (ValueError, paramiko.SSHException):
        return None


def _blob(text: str) -> Optional[bytes]:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def load_known_hosts(paths: Iterable[str]) -> KnownHosts:
    plain, authorities, revoked = [], [], []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as lines:
                text = lines.read().splitlines()
        except OSError:  # absent or unreadable: like ssh, go on with the others
            continue
        for line in text:
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            marker = fields.pop(0) if fields[0].startswith("@") else None
            blob = _blob(fields[2]) if len(fields) >= 3 else None
            if blob is None or marker not in (None, "@cert-authority", "@revoked"):
                continue  # does not parse, or a marker we do not know: never trusted
            if marker == "@revoked":
                revoked.append(blob)
            elif marker == "@cert-authority":
                key = _key(fields[1], blob)
                if key is not None:
                    authorities.append((fields[0], key))
            else:
                plain.append(KnownLine(fields[0], fields[1], blob))
    gone = set(revoked)
    return KnownHosts(tuple(line for line in plain if line.blob not in gone),
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
