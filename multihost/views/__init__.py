"""Presentation: listeners of run events. Only this package (and commands/) import rich."""
from __future__ import annotations

import os
import sys
from typing import IO, Optional


def no_color() -> bool:
    """NO_COLOR (no-color.org: set and not empty) means no colour, not no dashboard."""
    return bool(os.environ.get("NO_COLOR"))


def can_redraw(stream: IO[str]) -> bool:
    """A terminal a live view can redraw: the dashboard's rule (NO_COLOR keeps it, uncoloured)."""
    return bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"


def wants_plain(stream: IO[str]) -> bool:
    """Plain text for the tables (check, status, sync): not a terminal, NO_COLOR or dumb."""
    return not can_redraw(stream) or "NO_COLOR" in os.environ


def make_view(mode: str = "auto", out: Optional[IO[str]] = None, err: Optional[IO[str]] = None,
              **dashboard_options):
    """The listener for a run: ``auto`` (dashboard on a terminal, else plain), ``plain``,
    ``json``, or ``dashboard``."""
    out = out or sys.stdout
    err = err or sys.stderr
    if mode == "json":
        from .jsonl import JsonView

        return JsonView(out)
    if mode == "dashboard" or (mode == "auto" and can_redraw(out)):
        from .dashboard import Dashboard

        return Dashboard(out, **dashboard_options)
    from .plain import PlainView

    return PlainView(out, err, colour=mode == "auto" and not wants_plain(out))
