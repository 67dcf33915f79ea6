"""What the terminal allows: colour, a live view that redraws, or plain text. Its own module
so that every view can ask without importing the package that picks the views."""
from __future__ import annotations

import os
from typing import IO


def no_color() -> bool:
    """NO_COLOR (no-color.org: set and not empty) means no colour, not no dashboard."""
    return bool(os.environ.get("NO_COLOR"))


def can_redraw(stream: IO[str]) -> bool:
    """A terminal a live view can redraw: the dashboard's rule (NO_COLOR keeps it, uncoloured)."""
    return bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"


def wants_plain(stream: IO[str]) -> bool:
    """Plain text for the tables (check, status, sync): not a terminal, NO_COLOR or dumb."""
    return not can_redraw(stream) or "NO_COLOR" in os.environ
