"""The events of a sync and of a data check or copy (see ``multihost/events``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..sync.model import HostNeeds, HostSync


@dataclass(frozen=True)
class SyncScanned:
    files: int
    bytes: int
    hashed_files: int
    hashed_bytes: int
    seconds: float


@dataclass(frozen=True)
class SyncPlanned:
    host: str
    needs: HostNeeds


@dataclass(frozen=True)
class SyncHostDone:
    result: HostSync


@dataclass(frozen=True)
class SyncProgress:
    """Files and bytes delivered to one host so far (relayed files count on arrival at
    the first host of the relay, which forwards them as it writes them)."""

    host: str
    rank: int
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int


@dataclass(frozen=True)
class DataProgress:
    host: str
    rank: int
    path: str
    files: int
    bytes: int


@dataclass(frozen=True)
class SyncWaiting:
    """A host's helper waits for another sync of its workdir to finish (one writer at a
    time: remote/sync/lock.py); ``text`` names it."""

    host: str
    text: str
