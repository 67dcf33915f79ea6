"""The scaling table, as the reference docs print it: machines, processes per machine,
throughput, speed-up over one machine, scaling efficiency.

    speed-up    T(n) / T(base)
    efficiency  speed-up / (n / base)

where T(n) is the job's throughput on n machines and base is the fewest machines
measured (1 unless ``--counts`` leaves it out). PaddleDetection's "2 machines x 4 GPUs:
76%" is this efficiency. Pure: computed here, rendered by views/scale_view.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class ScalePoint:
    """One host count, measured by one ordinary run (``multihost status RUN_ID``)."""

    machines: int
    nproc_per_node: int
    throughput: float
    run_id: str
    rule: str = "global"       # how the ranks' numbers were combined (scale/measure.py)
    ranks: int = 1             # ranks that printed a value
    samples: int = 1           # steady samples the figure is the median of
    seconds: float = 0.0       # how long the run lasted, start to end

    @property
    def processes(self) -> int:
        return self.machines * self.nproc_per_node


@dataclass(frozen=True)
class ScaleRow:
    point: ScalePoint
    speedup: Optional[float]       # None when the baseline measured nothing (0)
    efficiency: Optional[float]


@dataclass(frozen=True)
class ScaleTable:
    command: str
    metric: str                    # what was read: the dashboard's speed, or --metric REGEX
    points: Tuple[ScalePoint, ...]

    @property
    def baseline(self) -> Optional[ScalePoint]:
        return min(self.points, key=lambda p: p.machines) if self.points else None

    def rows(self) -> Tuple[ScaleRow, ...]:
        base = self.baseline
        rows = []
        for point in sorted(self.points, key=lambda p: p.machines):
            if base is None or base.throughput <= 0:
                rows.append(ScaleRow(point, None, None))
                continue
            speedup = point.throughput / base.throughput
            rows.append(ScaleRow(point, speedup, speedup / (point.machines / base.machines)))
        return tuple(rows)

    def to_json(self) -> Dict[str, Any]:
        base = self.baseline
        return {
            "command": self.command,
            "metric": self.metric,
            "baseline_machines": base.machines if base else None,
            "points": [{
                "machines": row.point.machines,
                "nproc_per_node": row.point.nproc_per_node,
                "processes": row.point.processes,
                "throughput": round(row.point.throughput, 3),
                "speedup": _round(row.speedup),
                "efficiency": _round(row.efficiency),
                "run_id": row.point.run_id,
                "rule": row.point.rule,
                "ranks": row.point.ranks,
                "samples": row.point.samples,
                "seconds": round(row.point.seconds, 3),
            } for row in self.rows()],
        }


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 4)
