"""Datasets: the same copy on every host, verified by content (``verify_data``) and
repaired from the first host, host to host (``sync_data``)."""
from .model import (DataReport, DataSyncReport, HostData, HostDataSync, PathDiff, PathState,
                    data_error, describe)
from .repair import sync_data
from .verify import verify_data

__all__ = ["DataReport", "DataSyncReport", "HostData", "HostDataSync", "PathDiff", "PathState",
           "data_error", "describe", "sync_data", "verify_data"]
