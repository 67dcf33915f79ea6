"""The SSH transport's start-up: paramiko comes without invoke (fabric's dependency,
which paramiko imports for `Match exec` alone), and such a line still gets it."""
from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
import multihost.transport.ssh
print("invoke" in sys.modules)
import paramiko.config
print(paramiko.config.invoke.run.__module__.split(".")[0])
"""


def test_connecting_does_not_import_invoke_until_a_match_exec_line_needs_it():
    pytest.importorskip("invoke")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "invoke"]
