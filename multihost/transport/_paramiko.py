"""paramiko, imported for the two modules that use it (ssh.py, hostkeys.py), without
importing invoke with it.

paramiko.config imports invoke when it is installed (fabric brings it), and invoke imports
yaml, unittest.mock and more, all for `Match exec` lines in an ssh config: about 0.1 s of
CPU on every command that connects (a third of `exec -- true` on 8 hosts). invoke is
imported on first use instead, so such a line still works.
"""
from __future__ import annotations

import importlib.util
import sys


class _InvokeOnFirstUse:
    """Stands for invoke in paramiko.config until a `Match exec` line needs it."""

    def __getattr__(self, name: str):
        import invoke
        import paramiko.config

        paramiko.config.invoke = invoke
        return getattr(invoke, name)


def _import_paramiko():
    if "paramiko" in sys.modules or "invoke" in sys.modules:
        import paramiko
        return paramiko
    sys.modules["invoke"] = None  # type: ignore[assignment]  # paramiko's `import invoke` fails
    try:
        import paramiko
    finally:
        del sys.modules["invoke"]
    if importlib.util.find_spec("invoke") is not None:
        paramiko.config.invoke = _InvokeOnFirstUse()
    return paramiko


paramiko = _import_paramiko()
