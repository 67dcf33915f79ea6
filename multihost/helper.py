"""Ship and call the remote helper (``multihost/remote``) on a host.

The helper is named by a hash of its files and shipped as a gzipped tar made in memory;
it is unpacked on each host into ``~/.cache/multihost/helper-<hash>/`` (unpacked, not run as a
zip, so that Python caches its bytecode: a zip is compiled again on every run, tens of
milliseconds of CPU per call). A call runs it directly and only
uploads it when the host answers that it is missing (exit 97): a warm host pays one
round trip per operation, a cold one two more, once.

A host's login shell may print before our command runs (``echo Welcome`` in .bashrc:
bash reads it for commands sshd starts). So the helper's output starts with a marker
line, printed by the command line itself, after anything the shell printed: a reply is
read after the marker, and a stream's stdout starts after it (``launch``; the reading
is helper_output.py's).
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import shlex
import socket
import tarfile
import weakref
from pathlib import Path
from typing import Any, Dict, Optional

from .errors import CommandTimeout, ConnectError, RemoteError
from .transport import BrokenStream, CommandResult, Process, Transport
from .transport.openssh import login_command
from .helper_output import MARKER, HelperOutput, after_marker

MISSING = 97

# Connections on which the helper is known to be installed (a call of it answered, or
# it was just installed): a stream started on one needs no probe first. At 64 hosts the
# probe was 64 more round trips before a run's monitor heard anything. A connection
# dropped after a failure (HostGroup.forget) is a new object, and probes again.
_installed_on: "weakref.WeakSet[Transport]" = weakref.WeakSet()
# Its own line (the newline before it ends whatever the shell printed without one).
HELPER_DIR = "$HOME/.cache/multihost"
_ARCHIVE_TIME = 1577836800  # 2020-01-01: the same bytes from every checkout
_BOOT = "from mhremote.main import main\nmain()\n"


def _sources() -> "list[tuple[str, bytes]]":
    source = Path(__file__).with_name("remote")
    return [("__main__.py", _BOOT.encode())] + [
        (f"mhremote/{path.relative_to(source).as_posix()}", path.read_bytes())
        for path in sorted(source.rglob("*.py"))]


@functools.lru_cache(maxsize=1)
def helper_id() -> str:
    """The first 16 hex digits of a hash of the helper's files: it names the directory
    on the hosts, so a changed helper is a new one. Hashed, not archived: a call on a
    warm host needs only this name, and archiving costs milliseconds."""
    digest = hashlib.sha256()
    for name, data in _sources():
        digest.update(b"%s\0%d\0" % (name.encode(), len(data)))
        digest.update(data)
    return digest.hexdigest()[:16]


def helper_archive() -> bytes:
    """The helper as a gzipped tar (fixed times and owners), for installing it on a
    host. Compressed as one stream, not file by file as a zip is: every host's first
    contact uploads it (57 KB against a zip's 73 KB, 193 KB as it was stored)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in _sources():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, _ARCHIVE_TIME
            archive.addfile(info, io.BytesIO(data))
    return gzip.compress(buffer.getvalue(), 9, mtime=_ARCHIVE_TIME)


# Unpacks the archive from stdin next to where it will live, then renames it into place,
# so a helper directory is always whole; a concurrent install that loses the race cleans
# up (hosts that share the home install at once: the temporary name holds the host's
# name, as two hosts may give the same pid). Our own archive, but the "data" filter
# where Python has it (3.12 warns without).
_UNPACK = """\
import io, os, shutil, sys, tarfile
final = sys.argv[1]
temp = "%s.%s.%d.tmp" % (final, os.uname()[1], os.getpid())
with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read()), mode="r:gz") as archive:
    if hasattr(tarfile, "data_filter"):
        archive.extractall(temp, filter="data")
    else:
        archive.extractall(temp)
try:
    os.rename(temp, final)
except OSError:
    shutil.rmtree(temp, ignore_errors=True)
"""


def helper_path() -> str:
    return f"{HELPER_DIR}/helper-{helper_id()}"


def helper_command(transport: Transport, op: str, request: Optional[Dict[str, Any]] = None) -> str:
    """The shell line that runs one operation; exits 97 when the helper is not there yet."""
    python = shlex.quote(transport.host.python)
    args = shlex.quote(json.dumps(request or {}, separators=(",", ":")))
    return (f"printf '\\n%s\\n' {MARKER.decode()}; "
            f'H="{helper_path()}"; [ -d "$H" ] || exit {MISSING}; '
            f'exec {python} -S -E "$H/__main__.py" {op} {args}')


def not_the_helper(transport: Transport, what: str) -> RemoteError:
    """The interpreter ran, but what came back is not the helper's reply."""
    python = transport.host.python
    return RemoteError(f"{python} {what}", host=transport.host.label,
                       fix=f"check that `{login_hint(transport)} {python} -c 'print(1)'` prints "
                           "1; give a working python3 with --python (or python = in the hostfile)")


def install(transport: Transport, timeout: Optional[float] = None) -> None:
    """Unpack the helper on the host, within the caller's ``timeout`` (else 60 s): a
    python that hangs there is given up on, and ended, as the call itself would be."""
    data = helper_archive()
    python = shlex.quote(transport.host.python)
    line = (f'mkdir -p "{HELPER_DIR}" && exec {python} -S -c {shlex.quote(_UNPACK)} '
            f'"{helper_path()}"')
    result = transport.run(line, input=data, timeout=60 if timeout is None else timeout)
    if result.exit_code == 127:
        raise python_missing(transport)
    refused = python_refused(transport, result.stderr)
    if refused is not None:
        raise refused
    if not result.ok:
        raise RemoteError(f"cannot install the multihost helper: "
                          f"{result.stderr.decode(errors='replace').strip()[-200:]}",
                          host=transport.host.label,
                          fix="check that the home directory is writable and has free space")
    _installed_on.add(transport)


def python_refused(transport: Transport, stderr: bytes) -> Optional[RemoteError]:
    """The error when the shell could not execute the python (a directory above it, or
    the file, closed to this account: a venv under another user's home), else None."""
    python = transport.host.python
    text = stderr.decode("utf-8", "replace")
    if not any("Permission denied" in line and python in line for line in text.splitlines()):
        return None
    who = transport.host.user or "this account"
    return RemoteError(f"{python}: Permission denied: {who} may not execute it (the file, or "
                       "a directory above it, is closed to that user)", host=transport.host.label,
                       fix=f"`{login_hint(transport)} namei -l {shlex.quote(python)}` shows "
                           "which; give a python that user may run with --python (or python = "
                           "in the hostfile), e.g. --python /usr/bin/python3")


def python_missing(transport: Transport) -> RemoteError:
    return RemoteError(f"python interpreter {transport.host.python!r} not found",
                       host=transport.host.label,
                       fix="install python3 there, or give its path with --python")


def call(transport: Transport, op: str, request: Optional[Dict[str, Any]] = None, *,
         input: Optional[bytes] = None, timeout: Optional[float] = 60) -> Any:
    """Run one helper operation and return its result; its failure is a RemoteError."""
    line = helper_command(transport, op, request)
    try:
        result = transport.run(line, input=input, timeout=timeout)
    except ConnectError as err:
        # On a host without the helper, the shell exits 97 before reading a large input,
        # and the channel closes under our feet: install, then try once more.
        if err.kind != ConnectError.LOST or not input or not transport_alive(transport):
            raise
        result = CommandResult(transport.host.label, line, MISSING, b"", b"", 0.0)
    if result.exit_code == MISSING:
        install(transport, timeout)
        result = transport.run(line, input=input, timeout=timeout)
    elif result.exit_code != 127:  # the helper ran (127: no python; said below)
        _installed_on.add(transport)
    return parse_reply(transport, op, result.exit_code, after_marker(result.stdout), result.stderr)


class HeldCall:
    """A helper operation started now, answered later: its request (``"held": true``)
    is on the command line, its input comes with ``release``. The new channel and the
    interpreter's start, most of a call's time, overlap whatever the caller does
    meanwhile. ``release(input, go)`` sends ``input`` (one line), then the word "go"
    when ``go`` is true: without it the operation refuses and does nothing."""

    def __init__(self, transport: Transport, op: str, request: Dict[str, Any]):
        self.transport = transport
        self.op = op
        self.process = start(transport, op, dict(request, held=True))
        self.sent = False

    def release(self, input: bytes, go: bool) -> None:
        self.sent = True
        try:
            self.process.stdin.write(input + b"\n" + (b"go\n" if go else b""))
            self.process.stdin.close()
        except BrokenStream:
            pass  # it ended without reading all of it: its reply says why

    def reply(self, timeout: float = 60) -> Any:
        """Its result (after ``release``); its failure is a RemoteError."""
        process = self.process
        try:
            process.set_timeout(timeout)
            try:
                stdout = process.stdout.read()
                code = process.wait(timeout)
            except socket.timeout:
                raise CommandTimeout(f"helper operation {self.op!r} did not answer within "
                                     f"{timeout:g}s", host=self.transport.host.label) from None
            stderr = process.read_stderr()
        finally:
            process.close()
        return parse_reply(self.transport, self.op, code, stdout, stderr)

    def cancel(self) -> None:
        """Never released: the operation ends without doing anything."""
        if not self.sent:
            self.release(b"", go=False)
        self.process.close()


def transport_alive(transport: Transport) -> bool:
    try:
        return transport.run("true", timeout=30).ok
    except ConnectError:
        return False


def launch(transport: Transport, op: str, request: Optional[Dict[str, Any]] = None, *,
           first_line_within: Optional[float] = None) -> Process:
    """Start one helper operation as a stream, its stdout beginning with the helper's
    own output (every helper stream is started here). Exits 97 at once when the helper
    is missing. ``first_line_within``: for an op that answers at once, the seconds its
    first line may take (a python hanging as it starts is then given up on, and ended)."""
    process = transport.start(helper_command(transport, op, request))
    process.stdout = HelperOutput(process, transport.host.label,  # type: ignore[assignment]
                                  login_hint(transport), first_line_within,
                                  transport.host.python)
    return process


def login_hint(transport: Transport) -> str:
    """The `ssh` line that reaches this host as we did, for a fix to quote."""
    target = getattr(transport, "target", None)
    if target is not None:
        return login_command(target.user, shlex.quote(target.hostname), target.port)
    host = transport.host
    return login_command(host.user, shlex.quote(host.name), host.port)


def start(transport: Transport, op: str, request: Optional[Dict[str, Any]] = None) -> Process:
    """Start a streaming helper operation (it owns stdin and stdout)."""
    if transport not in _installed_on:
        probe = transport.run(f'[ -d "{helper_path()}" ]', timeout=30)
        if not probe.ok:
            install(transport)
        _installed_on.add(transport)
    return launch(transport, op, request)


def parse_reply(transport: Transport, op: str, code: int, stdout: bytes, stderr: bytes) -> Any:
    """The result of a reply: ``stdout`` is the helper's own output (after the marker)."""
    label = transport.host.label
    lines = stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1]) if lines else None
    except ValueError:
        reply = None
    if isinstance(reply, dict) and "ok" in reply:
        if reply["ok"]:
            return reply.get("result")
        raise RemoteError(str(reply.get("error")), host=label, fix=reply.get("fix"))
    err = stderr.decode("utf-8", "replace").strip()
    if code == 127 or "No such file or directory" in err and "python" in err.lower():
        raise python_missing(transport)
    refused = python_refused(transport, stderr)
    if refused is not None:
        raise refused
    out = stdout.strip()
    if out and not err:
        raise not_the_helper(transport, f"printed something that is not the multihost helper's "
                                        f"reply (exit status {code}): {out[:40]!r}")
    if code == MISSING:
        raise not_the_helper(transport, "did not unpack the multihost helper (exit status 97 "
                                        "after it was installed)")
    if not err:
        raise not_the_helper(transport, f"ended (exit status {code}) without running the "
                                        "multihost helper")
    last = err.splitlines()[-1]
    host = transport.host
    # The check of this one host, typed as shown (a bare `multihost check` checks this
    # machine alone).
    check = f"multihost check --ips={shlex.quote((host.user + '@' if host.user else '') + label)}"
    if host.python != "python3":
        check += f" --python {shlex.quote(host.python)}"
    raise RemoteError(f"helper operation {op!r} failed: {last[:300]}", host=label,
                      fix=f"run `{check}` to see what is missing there")
