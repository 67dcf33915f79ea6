"""Presentation: listeners of run events. Only this package (and commands/) import rich."""
from __future__ import annotations

import sys
from typing import IO, Optional

from .jsonl import JsonView
from .plain import PlainView
from .terminal import can_redraw, no_color, wants_plain  # noqa: F401 (the package's face)


def __getattr__(name: str):
    # The dashboard (rich, the board) is imported when drawn: a plain or JSON run's
    # output, piped or scripted, does not pay its import.
    if name == "Dashboard":
        from .dashboard import Dashboard
        return Dashboard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_view(mode: str = "auto", out: Optional[IO[str]] = None, err: Optional[IO[str]] = None,
              **dashboard_options):
    """The listener for a run: ``auto`` (dashboard on a terminal, else plain), ``plain``,
    ``json``, or ``dashboard``."""
    out = out or sys.stdout
    err = err or sys.stderr
    if mode == "json":
        return JsonView(out)
    if mode == "dashboard" or (mode == "auto" and can_redraw(out)):
        from .dashboard import Dashboard

        return Dashboard(out, **dashboard_options)
    return PlainView(out, err, colour=mode == "auto" and not wants_plain(out))
