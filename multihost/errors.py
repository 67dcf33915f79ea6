"""The one error tree of multihost.

Every failure a user can meet is a MultihostError: it names the host (when there is
one), the cause, and the fix, and renders as a single line. The CLI catches this tree
once, prints ``str(err)`` and exits with ``err.exit_code``; nothing else is caught there,
so a traceback always means a bug in multihost, never a user mistake.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .untrusted import clean_text

# Named exit codes, one per family, so scripts can tell a bad flag from a dead host.
EXIT_OK = 0
EXIT_FAILED = 1          # the job or a remote command failed
EXIT_USAGE = 2           # bad flags, bad hostfile, bad template: nothing was started
EXIT_CHECK = 3           # the preflight found a problem
EXIT_SYNC = 4            # code or data could not be made identical
EXIT_LAUNCH = 5          # the job could not be started everywhere
EXIT_INTERRUPTED = 130   # Ctrl-C, as shells report it
EXIT_CONNECT = 255       # a host could not be reached, as ssh reports it


def quoted(value: str, limit: int = 80) -> str:
    """A value the user gave, as a message quotes it: repr'd, and cut when long (a
    10,000-character flag is not echoed whole)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


class MultihostError(Exception):
    """Base of every error multihost reports to a user."""

    exit_code = EXIT_FAILED

    def __init__(self, cause: str, *, host: Optional[str] = None, fix: Optional[str] = None):
        # Causes often quote what a host said: cleaned here, so that no error, wherever it
        # is printed, carries a terminal escape or a second line (see untrusted.py).
        cause, fix = clean_text(cause, 8000), clean_text(fix, 8000) if fix else fix
        super().__init__(cause)
        self.cause = cause
        self.host = host
        self.fix = fix

    def __str__(self) -> str:
        text = f"{self.host}: {self.cause}" if self.host else self.cause
        if self.fix:
            text += f" (fix: {self.fix})"
        return text


class ConfigError(MultihostError):
    """Bad input: flags, hostfile, template, environment. Nothing was started."""

    exit_code = EXIT_USAGE


class ConnectError(MultihostError):
    """A host could not be reached or would not let us in. ``kind`` is the cause class."""

    exit_code = EXIT_CONNECT

    # The causes a user must tell apart, each with its own fix.
    NAME = "name"                # the name does not resolve
    REFUSED = "refused"          # nothing listens on the port
    TIMEOUT = "timeout"          # no answer within the connect timeout
    UNREACHABLE = "unreachable"  # no route, network down
    AUTH = "auth"                # key rejected, or a password would be needed
    HOSTKEY_UNKNOWN = "hostkey-unknown"
    HOSTKEY_CHANGED = "hostkey-changed"
    HOSTKEY_REVOKED = "hostkey-revoked"  # listed @revoked in known_hosts
    LOST = "lost"                # an open connection died
    PROTOCOL = "protocol"        # not an ssh server, or a negotiation failure

    def __init__(self, cause: str, *, host: str, kind: str, fix: Optional[str] = None):
        super().__init__(cause, host=host, fix=fix)
        self.kind = kind


class RemoteError(MultihostError):
    """A command or helper operation on a host failed in a way multihost did not expect."""


class BadReply(RemoteError):
    """A host sent something its protocol does not allow (a log frame naming a path, a
    malformed frame or record): a bug or a hostile host. Never retried; nothing of it is
    written."""


class CommandTimeout(RemoteError):
    """A remote command did not finish within its timeout."""


class CheckError(MultihostError):
    exit_code = EXIT_CHECK


class SyncError(MultihostError):
    exit_code = EXIT_SYNC


class LaunchError(MultihostError):
    exit_code = EXIT_LAUNCH


class RunFailed(MultihostError):
    """The job ran and failed; ``exit_code`` is the job's own status when it has one."""

    def __init__(self, cause: str, *, host: Optional[str] = None, fix: Optional[str] = None,
                 exit_code: int = EXIT_FAILED):
        super().__init__(cause, host=host, fix=fix)
        self.exit_code = exit_code


class LabError(MultihostError):
    """The local namespace lab could not be built, reached or torn down."""


def and_more(names: Sequence[str], shown: int = 3, unit: str = "",
             count: Optional[int] = None) -> str:
    """`` (and 2 more: a, b)``: what else an error line leaves out, named (the first
    ``shown``), never a bare count; '' when there is nothing more. ``count``: how many
    things the names stand for, when one name groups several (``ping on h[2-3]``)."""
    if not names:
        return ""
    listed = ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")
    count = len(names) if count is None else count
    return f" (and {count} more{' ' + unit if unit else ''}: {listed})"
