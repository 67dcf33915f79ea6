"""``python -m multihost``: the same command as the ``multihost`` script.

``-m`` puts the working directory first on ``sys.path``, and users run multihost from
their code directory: a training script named like a standard module (``numbers.py``,
``statistics.py``, ``queue.py``) would then be imported by the controller itself, in place
of the standard one. The installed script has no such entry; neither has this.
"""
import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .warm.client import run  # noqa: E402 (after the path is made safe)

run()
