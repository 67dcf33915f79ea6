"""Host-key verification the way OpenSSH does it, which fabric does not (deps notes).

Known keys come from the files the user's ssh reads: ``UserKnownHostsFile`` from
ssh_config, else ``~/.ssh/known_hosts`` (and ``known_hosts2``), plus the system-wide
``/etc/ssh/ssh_known_hosts``. An unknown key is refused unless the user asked for
accept-new, in which case it is appended to the user's known_hosts; a changed key is
always refused (paramiko raises BadHostKeyException before any policy is asked).
"""
from __future__ import annotations

import os
import threading
from typing import List, Optional

import paramiko

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


class UnknownHostKey(Exception):
    def __init__(self, name: str, key: paramiko.PKey):
        super().__init__(name)
        self.name = name
        self.fingerprint = f"{key.get_name()} {key.fingerprint}"


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or (accept-new) record them like StrictHostKeyChecking=accept-new."""

    def __init__(self, accept_new: bool, record_file: str):
        self.accept_new = accept_new
        self.record_file = record_file

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise UnknownHostKey(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _record_lock:
            directory = os.path.dirname(self.record_file)
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = os.open(self.record_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as out:
                out.write(line)
