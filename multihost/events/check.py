"""The events of a check (see ``multihost/events``)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckStage:
    """Where the check of one host is: "connecting", "checking", "done"."""

    host: str                       # label
    rank: int
    stage: str
