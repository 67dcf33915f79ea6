"""The job's python when a command names no host: the single-machine case of the
reference docs, run in place with the interpreter a torchrun started here would use."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys


def local_default(python3="python3"):
    """The job's python on this machine alone (no hosts given): ``python3``, unless the
    interpreter running multihost has a framework (torch, paddle) that ``python3`` lacks;
    then that interpreter, as a torchrun started from it would run."""
    mine = [name for name in ("torch", "paddle") if importlib.util.find_spec(name)]
    if not mine or not sys.executable:
        return python3
    found = shutil.which(python3)
    if found is None:
        return sys.executable
    if os.path.dirname(os.path.abspath(found)) == os.path.join(sys.prefix, "bin"):
        return python3   # the same environment
    probe = "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(n) for n in %r) " \
            "else 1)" % (mine,)
    try:
        done = subprocess.run([found, "-c", probe], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return sys.executable
    return python3 if done.returncode == 0 else sys.executable
