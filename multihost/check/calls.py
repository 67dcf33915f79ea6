"""How the check talks to a host's helper: ``helper.call`` with the check's own timeout
message, and a streaming start for the first host's call, which holds its listener
until told to reply.
"""
from __future__ import annotations

import threading
import time

from .. import helper
from ..errors import CommandTimeout
from ..untrusted import clean_report


def call(transport, op: str, request: dict, timeout: float):
    """One check op to completion: its reply's result, or a RemoteError."""
    try:
        return clean_report(helper.call(transport, op, request, timeout=timeout))
    except CommandTimeout:
        raise too_slow(transport, timeout) from None


def too_slow(transport, timeout: float) -> CommandTimeout:
    python = transport.host.python
    return CommandTimeout(
        f"the checks did not answer within {timeout:.0f}s (the host is overloaded, or {python} "
        "hangs while starting)", host=transport.host.label,
        fix=f"look at the host's load (uptime) and try `{python} -c pass` there; "
            "--timeout gives each host longer")


def start(transport, op: str, request: dict, deadline: float):
    """Start a streaming check op and read its first line, under a watchdog that closes
    the session at the deadline. A helper missing on the host shows as an immediate exit
    97: install it and start again. Returns (process, first line, watchdog)."""
    started = time.monotonic()
    for attempt in (1, 2):
        process = helper.launch(transport, op, request)
        # kill, not close: the session's process group on the host ends with it
        watchdog = threading.Timer(max(0.1, deadline - time.monotonic()), process.kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            line = process.stdout.readline()
        except (OSError, ValueError):
            line = b""  # closed by the watchdog
        if not line and time.monotonic() >= deadline:
            process.close()
            raise too_slow(transport, deadline - started)
        missing = not line and attempt == 1 and \
            process.wait(max(0.1, deadline - time.monotonic())) == helper.MISSING
        if not missing:
            return process, line, watchdog
        watchdog.cancel()
        process.close()
        helper.install(transport, max(1.0, deadline - time.monotonic()))
    raise AssertionError("not reached: the second attempt always returns")
