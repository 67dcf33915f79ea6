"""Plain prefixed lines: the view for pipes, CI, `--plain` and NO_COLOR.

Log lines go to ``out`` as ``HOST [RANK]: text``; a progress bar that redraws its line
(tqdm, Lightning, the HF Trainer) is printed there at most every PROGRESS_EVERY seconds
per rank while it runs, and whole when its line ends; what multihost itself says about the
run (starts, state changes, the root cause) goes to ``err`` prefixed ``multihost:``, so
a pipe into grep sees only the job's lines. Called from several threads: one lock.
"""
from __future__ import annotations

import os
import threading
from typing import IO, Dict, List, Tuple

from ..events import (GpuSample, LogBlock, LogLine, LogProgress, NodeChanged, NodeState, Notice, RootCause,
                      RunFinished, RunStarted, RunStopping, Stragglers)
from .gpus import describe as describe_gpus

GPU_EVERY = 60.0   # seconds between a host's GPU lines, unless its idle GPUs change
PROGRESS_EVERY = 30.0   # seconds between a rank's progress lines: a pipe reads every one

_COLOURS = ["36", "33", "35", "32", "34", "91", "96", "93"]


def describe_root_cause(cause: RootCause) -> str:
    rank = f" rank {cause.rank}" if cause.rank is not None and cause.rank >= 0 else ""
    return f"{cause.host} (node {cause.node_rank}){rank}: {cause.reason}"


def describe_stopping(event: RunStopping) -> str:
    """``stopping: SIGTERM sent to 2 hosts, up to 10 s (Ctrl-C again to kill now)``."""
    hosts = f"{event.hosts} host" + ("" if event.hosts == 1 else "s")
    if event.grace <= 0:
        return f"killing: SIGKILL sent to {hosts}"
    why = "" if event.reason.startswith("interrupted (Ctrl-C") else f" ({event.reason})"
    return f"stopping{why}: SIGTERM sent to {hosts}, up to {event.grace:g} s (Ctrl-C again to kill now)"


def ended_how(exit_code: int) -> str:
    """A run that ended without a root cause: stopped (Ctrl-C: 130, `stop`: 143), or failed."""
    return "stopped" if exit_code in (130, 143) else "failed"


def restart_line(event: RunFinished) -> str:
    """``run R attempt 1 of 3 failed: h2 (node 1) rank 3: exit 1; restarting as attempt 2 of 3``."""
    return (f"run {event.run_id} {event.attempt} failed: "
            f"{describe_root_cause(event.root_cause)}; restarting as {event.restarting}")


def logs_line(event: RunFinished) -> str:
    """Where each rank's log is, as the reference docs' users look for it:
    ``logs: log/latest/workerlog.N (this run: log/<run id>)``; N is the root cause's
    rank when one is known."""
    from ..logs.mirror_layout import latest_link

    mirror = shown_path(event.logs)
    cause = event.root_cause
    rank = cause.rank if cause is not None and cause.rank is not None and cause.rank >= 0 \
        else "N"
    return f"logs: {latest_link(mirror)}/workerlog.{rank} (this run: {mirror})"


def shown_path(path: str) -> str:
    """A path as a user types it from here: relative when it is under the cwd."""
    if not os.path.isabs(path):
        return os.path.normpath(path)
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


class PlainView:
    def __init__(self, out: IO[str], err: IO[str], colour: bool = False):
        self.out = out
        self.err = err
        self.colour = colour
        self._lock = threading.Lock()
        self._hosts: Dict[str, str] = {}
        self._prefixes: Dict[tuple, str] = {}
        self._stragglers = ""     # the last said, repeated in the summary at the end
        self._straggling_ranks: List[int] = []
        self._gpu_said: Dict[int, Tuple[float, Tuple[int, ...]]] = {}  # node: (time, idle)
        self._progress_said: Dict[tuple, float] = {}   # (host, rank): when its bar was printed

    def _prefix(self, event) -> str:
        host = event.host
        key = (host, event.rank, event.role, event.local_rank if event.role else 0)
        prefix = self._prefixes.get(key)
        if prefix is None:
            who = event.who
            if self.colour:
                code = self._hosts.setdefault(host, _COLOURS[len(self._hosts) % len(_COLOURS)])
                who = f"\x1b[{code}m{who}\x1b[0m"
            prefix = self._prefixes[key] = who + ": "
        return prefix

    def say(self, text: str) -> None:
        with self._lock:
            self.err.write(f"multihost: {text}\n")
            self.err.flush()

    def __call__(self, event: object) -> None:
        if isinstance(event, LogBlock):
            prefix = self._prefix(event)
            text = prefix + event.text.replace("\n", "\n" + prefix) + "\n"  # one write per block
            with self._lock:
                self.out.write(text)
                self.out.flush()
        elif isinstance(event, LogLine):
            with self._lock:
                self.out.write(f"{self._prefix(event)}{event.text}\n")
                self.out.flush()
        elif isinstance(event, LogProgress):
            key, now = (event.host, event.rank), event.time
            if now - self._progress_said.get(key, float("-inf")) >= PROGRESS_EVERY:
                self._progress_said[key] = now
                with self._lock:
                    self.out.write(f"{self._prefix(event)}{event.text}\n")
                    self.out.flush()
        elif isinstance(event, RunStarted):
            attempt = f" ({event.attempt})" if event.attempt else ""
            self.say(f"run {event.run_id}{attempt}: {len(event.hosts)} hosts x "
                     f"{event.nproc_per_node} processes: {event.command}")
            for line in event.replaced:
                self.say(line)
        elif isinstance(event, NodeChanged):
            code = f" (exit {event.exit_code})" if event.exit_code not in (None, 0) else ""
            detail = f": {event.detail}" if event.detail else ""
            if event.state in (NodeState.PENDING, NodeState.STOPPING):
                return  # stopping: said once for every host (RunStopping)
            self.say(f"{event.host} (node {event.node_rank}) {event.state.value}{code}{detail}")
        elif isinstance(event, Notice):
            self.say(f"{event.host} (node {event.node_rank}): {event.text}")
        elif isinstance(event, GpuSample):
            self._gpu(event)
        elif isinstance(event, RunStopping):
            self.say(describe_stopping(event))
        elif isinstance(event, Stragglers):
            self._straggling(event)
        elif isinstance(event, RunFinished):
            self._finished(event)
            if self._stragglers:
                self.say(f"stragglers: {self._stragglers}")

    def _straggling(self, event: Stragglers) -> None:
        """Said when who is slow changes (not when a percentage moves a little)."""
        before, self._stragglers = self._stragglers, event.text
        if [s.rank for s in event.stragglers] == self._straggling_ranks:
            return
        self._straggling_ranks = [s.rank for s in event.stragglers]
        if event.text:
            self.say(f"stragglers: {event.text}")
        elif before:
            self.say("no stragglers any more: every rank within 20% of the median")

    def _gpu(self, event: GpuSample) -> None:
        """A host's GPUs: its first sample, then once a minute, and at once when a GPU
        turns idle or busy again (a line every 5 s per host would drown a CI log)."""
        said = self._gpu_said.get(event.node_rank)
        if said is not None and said[1] == event.idle and event.time - said[0] < GPU_EVERY:
            return
        self._gpu_said[event.node_rank] = (event.time, event.idle)
        text = describe_gpus([event])
        if said is not None and said[1] and not event.idle:
            text += ", no GPU idle now"
        self.say(f"{event.host} (node {event.node_rank}): {text}")

    def _finished(self, event: RunFinished) -> None:
        cause = event.root_cause
        if event.restarting and cause is not None:   # the attempt failed, not the run
            lines = [restart_line(event)] + [f"  | {line}" for line in cause.tail]
            self.say("\n".join(lines))
            return
        if event.exit_code == 0:
            self.say(f"run {event.run_id} succeeded")
        elif cause is None:
            self.say(f"run {event.run_id} {ended_how(event.exit_code)} (exit {event.exit_code})")
        elif cause.kind != "slurm":   # Slurm's end of the job is the run's one error line
            lines = [f"run {event.run_id} failed; root cause: {describe_root_cause(cause)}"]
            lines += [f"  | {line}" for line in cause.tail]
            lines += [f"  then {line}" for line in cause.after]
            self.say("\n".join(lines))
        if event.logs:
            self.say(logs_line(event))
