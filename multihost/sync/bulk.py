"""Bulk streams through the system's OpenSSH client.

paramiko encrypts in Python packet by packet: about 100-150 MB/s on one core, and the
controller's CPU busy all along. The OpenSSH client does the same with AES-GCM in C,
several times faster. So the one stream that carries the heavy files (the head of a
relay) goes through `ssh` when the controller has it, with the same host, port, user,
keys and ssh config the paramiko connection used; everything else (small streams,
control) stays on the open paramiko connections. If `ssh` is missing or refuses
(a host key only paramiko was told to accept, say), the caller falls back to paramiko.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import threading
from typing import Callable, List, Optional

from .. import helper
from ..errors import ConnectError, MultihostError
from ..remote.sync.wire import Writer
from .transfer import HOP_CIPHERS, SendBuffer
from ..transport.openssh import DEFAULT_CONFIG, known_hosts_name, login_command, ssh_base



def openssh_argv(transport, config_file: str = DEFAULT_CONFIG) -> Optional[List[str]]:
    """`ssh` options reaching the host as the paramiko transport did, or None when there
    is no `ssh` here or the host is not reached over SSH."""
    target = getattr(transport, "target", None)
    if target is None or shutil.which("ssh") is None:
        return None
    # It connects to the resolved address: the key is checked under the name the paramiko
    # connection checked, with the same strictness, never the user's config's.
    argv = ssh_base(target.connect_timeout, accept_new=target.accept_new,
                    key_name=known_hosts_name(target.hostname, target.port)) + [
        "-o", "Compression=no", "-c", HOP_CIPHERS, "-p", str(target.port), "-l", target.user]
    if config_file and os.path.expanduser(config_file) != os.path.expanduser(DEFAULT_CONFIG):
        argv += ["-F", os.path.expanduser(config_file)]
    for identity in target.identity_files:
        argv += ["-i", identity]
    if target.identity_files:
        argv += ["-o", "IdentitiesOnly=yes"]
    user_files = [p for p in target.known_hosts if p != "/etc/ssh/ssh_known_hosts"]
    if user_files:
        argv += ["-o", "UserKnownHostsFile=" + " ".join(f'"{p}"' for p in user_files)]
    if target.proxy_jump:
        argv += ["-J", target.proxy_jump]
    return argv + ["--", target.hostname]


def stream_openssh(transport, argv: List[str], request: dict, fill: Callable[[Writer], None],
                   op: str = "sync.receive",
                   register: Optional[Callable[[object], None]] = None) -> dict:
    """Like transfer.stream_to, through `ssh`: start ``op`` on the host, write the
    stream with ``fill``, return the reply's ``nodes``."""
    label = transport.host.label
    line = helper.helper_command(transport, op, request)
    process = subprocess.Popen(argv + [line], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    if register is not None:
        register(process)
    errors: List[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(process.stderr.read()), daemon=True)
    reader.start()
    try:
        sink = SendBuffer(process.stdin)
        try:
            writer = Writer(sink)
            fill(writer)
            writer.end()
            sink.flush()
            process.stdin.close()
        except MultihostError:
            raise
        except OSError as exc:  # the ssh client is gone: it says why on stderr
            process.wait(30)
            reader.join(5)
            raise _failure(transport, process.returncode, b"".join(errors), exc) from None
        out = process.stdout.read()
        code = process.wait()
        reader.join(5)
    finally:
        if process.poll() is None:
            process.kill()  # ours, started above: never left behind
            process.wait()
    err = b"".join(errors)
    out = helper.after_marker(out)
    if code == 255 and not out.strip():
        raise _failure(transport, code, err, None)
    result = helper.parse_reply(transport, op, code, out, err)
    nodes = result.get("nodes") if isinstance(result, dict) else None
    if not isinstance(nodes, dict):
        raise ConnectError("no results from the host over ssh", host=label, kind=ConnectError.LOST,
                           fix="run the sync again")
    return nodes


def _failure(transport, code: Optional[int], stderr: bytes, exc: Optional[Exception]) -> ConnectError:
    text = stderr.decode("utf-8", "replace").strip().splitlines()
    cause = text[-1] if text else (str(exc) if exc else f"exit {code}")
    target = transport.target
    login = login_command(target.user, shlex.quote(target.hostname), target.port)
    return ConnectError(f"ssh failed: {cause}", host=transport.host.label, kind=ConnectError.LOST,
                        fix=f"check that `{login}` works without a prompt")
