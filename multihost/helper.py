"""Ship and call the remote helper (``multihost/remote``) on a host.

The helper is named by a hash of its files and shipped as a zip made in memory; it is
unpacked on each host into ``~/.cache/multihost/helper-<hash>/`` (unpacked, not run as a
zip, so that Python caches its bytecode: a zip is compiled again on every run, tens of
milliseconds of CPU per call). A call runs it directly and only
uploads it when the host answers that it is missing (exit 97): a warm host pays one
round trip per operation, a cold one two more, once.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import shlex
from pathlib import Path
from typing import Any, Dict, Optional

from .errors import ConnectError, RemoteError
from .transport import CommandResult, Process, Transport

MISSING = 97
HELPER_DIR = "$HOME/.cache/multihost"
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)
_BOOT = "from mhremote.main import main\nmain()\n"


def _sources() -> "list[tuple[str, bytes]]":
    source = Path(__file__).with_name("remote")
    return [("__main__.py", _BOOT.encode())] + [
        (f"mhremote/{path.name}", path.read_bytes()) for path in sorted(source.glob("*.py"))]


@functools.lru_cache(maxsize=1)
def helper_id() -> str:
    """The first 16 hex digits of a hash of the helper's files: it names the directory
    on the hosts, so a changed helper is a new one. Hashed, not zipped: a call on a
    warm host needs only this name, and zipping costs milliseconds."""
    digest = hashlib.sha256()
    for name, data in _sources():
        digest.update(b"%s\0%d\0" % (name.encode(), len(data)))
        digest.update(data)
    return digest.hexdigest()[:16]


def helper_zip() -> bytes:
    """The helper as zip bytes (fixed timestamps), for installing it on a host."""
    import zipfile  # only when a host lacks the helper
    
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in _sources():
            archive.writestr(zipfile.ZipInfo(name, _ZIP_DATE), data)
    return buffer.getvalue()


# Unpacks the zip from stdin next to where it will live, then renames it into place, so
# a helper directory is always whole; a concurrent install that loses the race cleans up.
_UNPACK = """\
import io, os, shutil, sys, zipfile
final = sys.argv[1]
temp = "%s.%d.tmp" % (final, os.getpid())
zipfile.ZipFile(io.BytesIO(sys.stdin.buffer.read())).extractall(temp)
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
    return f'H="{helper_path()}"; [ -d "$H" ] || exit {MISSING}; exec {python} -S -E "$H/__main__.py" {op} {args}'


def install(transport: Transport) -> None:
    data = helper_zip()
    python = shlex.quote(transport.host.python)
    line = (f'mkdir -p "{HELPER_DIR}" && exec {python} -S -c {shlex.quote(_UNPACK)} '
            f'"{helper_path()}"')
    result = transport.run(line, input=data, timeout=60)
    if result.exit_code == 127:
        raise python_missing(transport)
    if not result.ok:
        raise RemoteError(f"cannot install the multihost helper: "
                          f"{result.stderr.decode(errors='replace').strip()[-200:]}",
                          host=transport.host.label,
                          fix="check that the home directory is writable and has free space")


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
        install(transport)
        result = transport.run(line, input=input, timeout=timeout)
    return parse_reply(transport, op, result.exit_code, result.stdout, result.stderr)


def transport_alive(transport: Transport) -> bool:
    try:
        return transport.run("true", timeout=30).ok
    except ConnectError:
        return False


def start(transport: Transport, op: str, request: Optional[Dict[str, Any]] = None) -> Process:
    """Start a streaming helper operation (it owns stdin and stdout)."""
    probe = transport.run(f'[ -d "{helper_path()}" ]', timeout=30)
    if not probe.ok:
        install(transport)
    return transport.start(helper_command(transport, op, request))


def parse_reply(transport: Transport, op: str, code: int, stdout: bytes, stderr: bytes) -> Any:
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
    last = err.splitlines()[-1] if err else f"exit status {code}"
    raise RemoteError(f"helper operation {op!r} failed: {last[:300]}", host=label,
                      fix="run `multihost check` on this host to see what is missing")
