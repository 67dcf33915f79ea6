"""Logs: every rank's lines followed from the hosts (``LogFollower``), mirrored to
``./log`` and read back from there, and the metrics parsed from them."""
from .follow import LogFollower
from .mirror_layout import ensure_private, nodes_of
from .metrics import Metrics, parse_metrics
from .mirror import LineFilter, parse_ranks, parse_since, read_mirror

__all__ = ["LineFilter", "LogFollower", "Metrics", "ensure_private", "nodes_of",
           "parse_metrics", "parse_ranks", "parse_since", "read_mirror"]
