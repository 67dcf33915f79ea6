"""Measure each host count with an ordinary run: check, sync, launch and follow through
the ordinary run (so each point has its record, `multihost status --list` shows it, and
its logs are mirrored), read its throughput from its ranks' lines, and stop it once it
has run long enough.

How long a point runs:
  --seconds S   S seconds counted from its first throughput sample (start-up, which grows
                with the host count, is not measured), then it is stopped on every host
  --steps N     until a rank's log says step N (the step the dashboard reads), then stopped
  neither       the job runs to its own end
A point that fails by itself (a rank exits 1, a host is lost) ends the scaling run with
the run's own error; the points measured before it are kept (``on_point``).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Sequence, Tuple

from ..errors import ConfigError, RunFailed, EXIT_INTERRUPTED
from ..events import LogBlock, LogLine
from ..hosts import Host
from .measure import MetricReader, Samples, measure
from .table import ScalePoint

Notify = Callable[[str], None]


@dataclass(frozen=True)
class ScaleOptions:
    counts: Tuple[int, ...]                 # host counts, ascending (scale/plan.py)
    seconds: Optional[float] = None         # per point, from its first sample
    steps: Optional[int] = None             # per point: stop at this step
    metric: Optional[str] = None            # --metric REGEX; None: the dashboard's speed
    metric_is: str = "auto"                 # auto, global, per-rank (scale/measure.py)

    def check(self) -> None:
        if self.seconds is not None and not 0 < self.seconds < float("inf"):
            raise ConfigError(f"--seconds {self.seconds:g} is not a number of seconds above 0",
                              fix="e.g. --seconds 60")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"--steps {self.steps} is not a step count above 0",
                              fix="e.g. --steps 200")
        MetricReader(self.metric)   # a bad regex is refused before anything starts

    def length(self) -> str:
        parts = ([f"{self.seconds:g} s of throughput"] if self.seconds else []) + \
                ([f"step {self.steps}"] if self.steps else [])
        return " or ".join(parts) if parts else "its own end"


class _Stopper:
    """Stops a point's run once it ran long enough: a timer for --seconds (a job that
    goes quiet must still be stopped), the steps read from each block for --steps."""

    REASON = "multihost scale: the point was measured"

    def __init__(self, options: ScaleOptions, samples: Samples, holder: Dict[str, object]):
        self.options, self.samples, self.holder = options, samples, holder
        self.fired = False
        self.timer: Optional[threading.Timer] = None
        self.lock = threading.Lock()

    def seen(self) -> None:
        if self.options.seconds and self.samples.first_at is not None and self.timer is None:
            self.timer = threading.Timer(self.options.seconds, self.stop)
            self.timer.daemon = True
            self.timer.start()
        if self.options.steps and self.samples.top_step >= self.options.steps:
            self.stop()

    def stop(self) -> None:
        with self.lock:
            controls = self.holder.get("controls")
            if self.fired or controls is None:
                return
            self.fired = True
        controls.stop(self.REASON)

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


def measure_point(cluster, request, options: ScaleOptions, notify: Notify,
                  checked=None, on_record: Callable[[object], None] = lambda record: None
                  ) -> ScalePoint:
    """One host count: one ordinary run on ``cluster``'s hosts, measured and ended
    (``checked``: the preflight of all the hosts, passed before the first point;
    ``on_record``: told the point's first record, before it starts)."""
    from ..run import request as run_request
    from ..run.lifecycle import Lifecycle

    life = Lifecycle(cluster, request, notify=notify)
    plan, record = life.attempt(0, checked=checked)
    on_record(record)
    nproc = plan.nodes[0].nproc
    notify(f"{len(plan.nodes)} host(s) x {nproc} process(es): run {plan.run_id}, "
           f"measured until {options.length()}")
    samples = Samples(MetricReader(options.metric))
    holder: Dict[str, object] = {}
    stopper = _Stopper(options, samples, holder)

    def listen(event: object) -> None:
        if isinstance(event, LogBlock):
            samples.add(event.rank, event.lines, event.time)
        elif isinstance(event, LogLine):
            samples.add(event.rank, [event.text], event.time)
        else:
            return
        stopper.seen()

    started = time.time()
    try:
        outcome = life.execute(listen, holder)
    finally:
        stopper.cancel()
    if outcome.interrupted:
        raise RunFailed(f"scaling stopped: run {plan.run_id} was interrupted on every host",
                        exit_code=EXIT_INTERRUPTED)
    if outcome.exit_code != 0 and not (stopper.fired and outcome.cause is None):
        raise run_request.failure_of(outcome, plan)
    found = measure(samples, plan.world_size, options.metric_is, run_id=plan.run_id,
                    host=plan.nodes[0].host.label)
    return ScalePoint(len(plan.nodes), nproc, found.value, plan.run_id, found.rule,
                      found.ranks, found.samples, time.time() - started)


def scale_points(hosts: Sequence[Host], connect: Callable[[Sequence[Host]], object], request,
                 options: ScaleOptions, notify: Notify = lambda text: None,
                 on_record: Callable[[object], None] = lambda record: None
                 ) -> Iterator[ScalePoint]:
    """Each host count's point in turn, on the first ``count`` hosts (node rank order):
    ``connect(hosts)`` gives the fan-out cluster of those hosts. The cluster is checked
    once, all of it, before the first point (a host that would fail the last point is
    found before any is measured); the points then start without a preflight of their
    own, each on the start port that check found free."""
    from ..run import request as run_request
    from ..run.steps import preflight

    options.check()
    if request.detach or request.max_restarts:
        raise ConfigError("a scaling point is followed to its end and measured once",
                          fix="drop --detach and --max-restarts")
    checked = None
    if request.check:
        job = run_request.validate(hosts, request).job
        with connect(tuple(hosts)) as cluster:
            checked = preflight(cluster, job, allow_concurrent=request.allow_concurrent,
                                notify=notify)
    for index, count in enumerate(options.counts, 1):
        notify(f"point {index} of {len(options.counts)}: {count} host(s)")
        with connect(tuple(hosts[:count])) as cluster:
            yield measure_point(cluster, request, options, notify, checked, on_record)
