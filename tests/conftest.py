"""Shared by every test: multihost commands started by a test run cold.

A warm controller (multihost/warm/) outlives the command that starts it, for minutes; a
suite that starts hundreds of commands would leave hundreds behind. The tests of the warm
controller turn it on for themselves and stop what they start. A test that builds its
environment without MULTIHOST_WARM still starts one: those are stopped at the end of the
session (by pid, only processes this session's commands started) and named."""
import os
import secrets
import signal
import sys

import pytest

os.environ["MULTIHOST_WARM"] = "0"
# Not a MULTIHOST_ name: tests that drop those from their commands' environment keep it.
SESSION = os.environ["MH_TEST_SESSION"] = secrets.token_hex(8)


def _warm_servers_of_this_session():
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else ()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"multihost.warm.server" not in cmdline.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
        except OSError:
            continue
        if f"MH_TEST_SESSION={SESSION}".encode() in variables:
            started_by = next((v.decode(errors="replace").partition("=")[2] for v in variables
                               if v.startswith(b"PYTEST_CURRENT_TEST=")), "?")
            yield int(pid), started_by


@pytest.fixture(scope="session", autouse=True)
def no_warm_controller_left_behind():
    yield
    for pid, started_by in _warm_servers_of_this_session():
        os.kill(pid, signal.SIGTERM)
        print(f"\nconftest: stopped a warm controller (pid {pid}) started by {started_by}",
              file=sys.stderr)
