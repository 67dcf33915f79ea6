"""How a host's GPUs read in every view, in one compact phrase:
``gpu 72% (min 0%) 31/80G 64C 310W, gpu 3 idle``: utilization, memory used/total (per
GPU), temperature and power averaged over the run's GPUs of the sample, the least busy
GPU's utilization when it is below the average, and the GPUs idle for two samples."""
from __future__ import annotations

from typing import Optional, Sequence

from ..events import GpuSample


def _mean(values) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def describe(samples: Sequence[GpuSample], idle: bool = True) -> str:
    """The phrase for one host's latest sample (or the hosts of a folded row); "" when
    there is none. ``idle``: say which GPUs are idle (only while the host runs)."""
    gpus = [gpu for sample in samples for gpu in sample.gpus]
    if not gpus:
        return ""
    util = _mean(g.util for g in gpus)
    parts = ["gpu", "-" if util is None else f"{util:.0f}%"]
    lowest = min((g.util for g in gpus if g.util is not None), default=None)
    if lowest is not None and util is not None and lowest < round(util):
        parts.append(f"(min {lowest}%)")
    used, total = _mean(g.used_mib for g in gpus), _mean(g.total_mib for g in gpus)
    if used is not None and total is not None:
        parts.append(f"{used / 1024:.0f}/{total / 1024:.0f}G")
    temp, power = _mean(g.temp_c for g in gpus), _mean(g.power_w for g in gpus)
    if temp is not None:
        parts.append(f"{temp:.0f}C")
    if power is not None:
        parts.append(f"{power:.0f}W")
    text = " ".join(parts)
    idle_gpus = sorted({i for s in samples for i in s.idle}) if idle else []
    if idle_gpus:
        text += f", gpu {','.join(str(i) for i in idle_gpus)} idle"
    return text
