"""The execute step of one attempt (lifecycle.py): announce, prepare and launch every host
(start.py), then either return (--detach) or watch it to its end: node states from the
monitor, rank logs from the log follower (logs/follow.py), both into one listener (the
view). The view is given, never built here: no presentation in this module.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from ..errors import ConfigError
from ..events import Listener, Notice, RunStarted, RunState
from .restarts import attempt_label
from .interrupts import Interrupts
from .monitor import POLL_INTERVAL, Monitor
from .outcome import AttemptEnd, detached_end
from .plan import RunPlan, launch_request
from .start import RecordKeeper, Starter
from .records import RunRecord

SETTLE_TIMEOUT = 30.0  # at most, to let the last log lines arrive (done once every host said so)


@dataclass(frozen=True)
class RunOptions:
    detach: bool = False
    wait_after_exit: Optional[float] = None
    poll_interval: float = POLL_INTERVAL
    lost_after: Optional[float] = None    # None: MULTIHOST_LOST_AFTER's (waits.py)
    hang_timeout: Optional[float] = None
    # (the attempt's end, its record) -> the label of the attempt that follows, or ''
    restarting: Callable[[AttemptEnd, Any], str] = lambda end, record: ""


STOP_FROM_DASHBOARD = "stopped from the dashboard ([s] on the controller)"


class Controls:
    """What the dashboard's keys do: [s] stops the run on every host (recorded as a stop
    from the dashboard, not as a Ctrl-C), [d] stops following only."""

    def __init__(self, interrupts: Interrupts):
        self.interrupts = interrupts

    def stop(self, reason: str = STOP_FROM_DASHBOARD) -> None:
        """Stop on every host, recorded as ``reason`` (a stop on purpose, not a Ctrl-C)."""
        if self.interrupts.count == 0:
            self.interrupts.reason = reason
        self.interrupts.count += 1

    def detach(self) -> None:
        self.interrupts.detached = True


def _open_mirror(record: RunRecord, starter: Starter) -> Optional[Path]:
    """The controller's log mirror, made before anything is launched: a directory that
    cannot be made must stop the run, not leave it running with nobody watching."""
    if not record.log_dir:  # no mirror asked for (an embedding caller): states only
        return None
    from ..logs.mirror_layout import ensure_private

    try:
        return ensure_private(Path(record.log_dir))
    except OSError as exc:
        starter.rollback("the run did not start: the log mirror could not be made")
        raise ConfigError(f"cannot make the log mirror {record.log_dir}: "
                          f"{exc.strerror or exc}",
                          fix="give a directory you can write with --log_dir") from None


def _log_follower(cluster, plan: RunPlan, mirror: Optional[Path], listener: Listener):
    """The lead's LogFollower (logs/follow.py), reporting lines only: node states are ours."""
    if mirror is None:
        return None
    from ..logs.follow import LogFollower

    pairs = [(node.host, node.nproc) for node in plan.nodes]
    return LogFollower(cluster, plan.run_id, pairs, mirror, listener, follow=True,
                       report_states=False, latest=True,
                       first_servers=plan.ps.first_servers() if plan.ps is not None else ()).start()


def replaced_lines(record: RunRecord) -> Tuple[str, ...]:
    """What the views say of the spares that took a rank for this attempt."""
    from ..spares import Replacement

    return tuple(Replacement.from_json(r).line for r in record.replacements
                 if int(r.get("attempt") or 0) == record.attempt)


def launch_and_watch(cluster, plan: RunPlan, keeper: RecordKeeper, listener: Listener,
                     options: RunOptions = RunOptions(),
                     holder: Optional[Dict[str, object]] = None) -> AttemptEnd:
    """The attempt's end; ``keeper`` holds its record, as saved at every change."""
    record = keeper.record
    with Interrupts() as interrupts:
        if holder is not None:
            holder["controls"] = Controls(interrupts)
        listener(RunStarted(plan.run_id, tuple(n.host.label for n in plan.nodes),
                            plan.nodes[0].nproc, plan.display_command(), time.time(),
                            attempt_label(plan.attempt, record.max_restarts),
                            replaced_lines(record), name=getattr(plan, "name", "")))
        starter = Starter(cluster, plan, listener, keeper, interrupts)
        prepared = starter.prepare()
        keeper.make_last()  # every host is ours: this run started (a refused one did not)
        mirror = None if options.detach else _open_mirror(record, starter)
        display = launch_request(plan, plan.nodes[0], prepared[0])["display"]
        keeper.update(node0_argv=display["command"], env=display["env"], started=time.time())
        # Followed, every node hears that all launched on its status stream (the monitor's).
        starter.launch(confirm=options.detach)
        if options.detach:
            if interrupts():   # Ctrl-C came as the last nodes confirmed: nothing goes on
                starter.rollback("interrupted during the launch")
                raise KeyboardInterrupt
            keeper.update(state=RunState.RUNNING)
            return detached_end()
        from .progress import ProgressWatch

        progress = listener = ProgressWatch(
            listener, save=lambda items: keeper.update(stragglers=tuple(items)))
        hang = None
        if options.hang_timeout:
            from .hangs import HangWatch

            hang = listener = HangWatch(listener, options.hang_timeout, plan, record,
                                        cluster, mirror, steps=progress.last_advance)
        follower = None

        def settle(lost: bool) -> None:
            if follower is not None:
                follower.drain(timeout=2.0 if lost else SETTLE_TIMEOUT)
                follower.stop()
                for rank, why in sorted(follower.mirror_behind.items()):
                    if why:  # the job's status stands, but its mirror must not pass for whole
                        listener(Notice(rank, plan.nodes[rank].host.label,
                                        f"the log mirror lacks lines ({why}); "
                                        f"`multihost logs {plan.run_id}` completes it from "
                                        f"the host once there is room", time.time()))

        monitor = Monitor(cluster, plan, listener, keeper, interrupts,
                          poll_interval=options.poll_interval, lost_after=options.lost_after,
                          wait_after_exit=options.wait_after_exit, settle=settle,
                          tick=progress.tick, restarting=options.restarting,
                          steps=starter.steps,
                          **({"hung": hang.check} if hang is not None else {}))
        monitor.watch_all()
        follower = _log_follower(cluster, plan, mirror, listener)
        end = monitor.watch_to_end()
        if end.detached and follower is not None:
            follower.stop()
        return dataclasses.replace(end, run_dirs={rank: p.run_dir for rank, p in prepared.items()})
