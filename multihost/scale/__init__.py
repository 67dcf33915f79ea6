"""Scaling: one job measured on 1, 2, 4, ... hosts and on all of them, each point an
ordinary run, its throughput read from the logs, and the table of speed-up and scaling
efficiency the reference docs print."""
from .measure import MetricReader, Samples, Throughput, parse_metric_is
from .plan import parse_counts, plan_counts
from .runner import ScaleOptions, scale_points
from .table import ScalePoint, ScaleRow, ScaleTable

__all__ = ["MetricReader", "Samples", "ScaleOptions", "ScalePoint", "ScaleRow", "ScaleTable",
           "Throughput", "parse_counts", "parse_metric_is", "plan_counts", "scale_points"]
