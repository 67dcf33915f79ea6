"""The live dashboard: one row per host (or rank) in rank order, recent lines below, the
root cause when something failed, and the keys in a footer.

It redraws at a steady rate from a snapshot of the model, however fast lines arrive;
receiving an event only updates the model (``BoardModel.apply``), never draws.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Callable, Optional

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..events import NodeState, Notice, RunFinished
from .terminal import no_color
from .board import BoardModel, BoardSnapshot
from .board_folding import FoldedRow, fold_rows, summary
from .gpus import describe as describe_gpus
from .plain import PlainView, describe_root_cause, describe_stopping, logs_line, restart_line

STATE_STYLE = {
    NodeState.PENDING: "dim", NodeState.SYNCING: "cyan", NodeState.LAUNCHING: "cyan",
    NodeState.RUNNING: "green", NodeState.SUCCEEDED: "bold green", NodeState.FAILED: "bold red",
    NodeState.LOST: "bold magenta", NodeState.STOPPED: "yellow", NodeState.STOPPING: "bold yellow",
}
# [d] and [q] differ: [d] leaves (the run goes on without a controller watching it), [q]
# only closes the dashboard (the controller keeps following, in plain lines).
# The keys that end or leave the view first: at 80 columns they are all on the first line.
KEYS = ("[s] stop the run  [d] detach  [q] plain lines  [1-9] a host's log  [n/p] next/prev  "
        "[g N Enter] host or rank #N  [a] all")
CONFIRM = "stop the run on every host? [y] yes, stop it  [any other key] no"


def _uptime(since: Optional[float], until: Optional[float], now: float) -> str:
    if since is None:
        return "-"
    seconds = int((until or now) - since)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _num(value: Optional[float], digits: int = 4) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.{digits}g}"


def _span(values) -> str:
    """One value, or the range of a folded row's values ("-" when none has one)."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    low, high = min(known), max(known)
    return _num(low) if low == high else f"{_num(low)}-{_num(high)}"


def _gpu_cell(group: FoldedRow) -> Text:
    """The rows' GPUs; an idle GPU said only while its host runs, in red."""
    row = group.rows[0]
    text = describe_gpus([r.gpu for r in group.rows if r.gpu is not None],
                         idle=row.state == NodeState.RUNNING)
    return Text(text, style="bold red" if text.endswith(" idle") else "")


def _add_row(table: Table, group: FoldedRow, now: float, gpus: bool = False) -> None:
    row, count = group.rows[0], len(group.rows)
    state = row.state.value + (f" ({row.exit_code})" if row.exit_code not in (None, 0) else "")
    state_text = Text(state, style=STATE_STYLE.get(row.state, ""))
    if row.slow:  # a straggler's mark, beside its state (folding keeps it apart)
        state_text.append(f" {row.slow}", style="bold yellow")
    style = "red" if row.state in (NodeState.FAILED, NodeState.LOST) else None
    speeds = [r.metrics.speed for r in group.rows if r.metrics.speed is not None]
    if row.note:
        last = Text(f"[{row.note}]", style="magenta")
    elif count > 1:  # the newest line of the folded rows' first, said to be one of many
        last = Text.assemble((f"({count} {'ranks' if row.rank is not None else 'hosts'}) ", "dim"),
                             row.last_line)
    else:
        last = Text(row.last_line)
    gpu = [_gpu_cell(group)] if gpus else []
    table.add_row(group.numbers, group.who, state_text,
                  _uptime(row.since, row.until, now),
                  _span(r.metrics.epoch for r in group.rows), _span(r.metrics.step for r in group.rows),
                  _span(r.metrics.loss for r in group.rows),
                  _num(sum(speeds)) if speeds else "-", *gpu, last, style=style)


def render(snapshot: BoardSnapshot, now: Optional[float] = None, keys: bool = True,
           confirming: bool = False):
    """The whole screen for one snapshot (a pure function: tests render it to text)."""
    now = time.time() if now is None else now
    table = Table(expand=True, title=f"multihost run {snapshot.run_id}" if snapshot.run_id else None,
                  caption=snapshot.command or None, title_justify="left")
    # The gpu column only when a host has sampled its GPUs (no nvidia-smi: no column).
    gpus = any(row.gpu is not None for row in snapshot.rows)
    for name, kwargs in (("#", {"justify": "right"}), ("host", {}), ("state", {}),
                         ("uptime", {"justify": "right"}), ("epoch", {"justify": "right"}),
                         ("step", {"justify": "right"}), ("loss", {"justify": "right"}),
                         ("speed", {"justify": "right"}),
                         *((("gpu", {"no_wrap": True}),) if gpus else ()),
                         ("last line", {"ratio": 1, "no_wrap": True})):
        table.add_column(name, overflow="ellipsis", **kwargs)
    for group in fold_rows(snapshot.rows, snapshot.selected):
        _add_row(table, group, now, gpus)
    if snapshot.total_speed is not None:
        table.add_section()
        table.add_row("", "all", "", "", "", "", "", _num(snapshot.total_speed),
                      *([""] if gpus else []), snapshot.speed_label)
    parts = [table, Text(summary(snapshot.rows), style="bold")]
    if snapshot.stragglers:
        parts.append(Text(f"stragglers: {snapshot.stragglers}", style="bold yellow"))
    if snapshot.stopping is not None and snapshot.exit_code is None:
        # Right under the rows, not at the bottom: a short terminal crops the bottom.
        parts.append(Text("multihost: " + describe_stopping(snapshot.stopping), style="bold yellow"))
    if snapshot.selected:
        body = Text("\n".join(snapshot.selected_lines[-30:]) or "(no lines yet)")
        parts.append(Panel(body, title=f"log of {snapshot.selected}", border_style="blue"))
    else:
        recent = Table.grid(expand=True)
        recent.add_column(no_wrap=True, overflow="ellipsis")
        for line in snapshot.recent:  # one screen line each: a long line is cut, not wrapped
            recent.add_row(Text.assemble((f"{line.who}: ", "cyan" if line.count == 1 else "bold cyan"),
                                         line.text))
        parts.append(Panel(recent if snapshot.recent else Text("(no output yet)", style="dim"),
                           title="recent lines",
                           border_style="dim"))
    if snapshot.root_cause is not None:
        cause = snapshot.root_cause
        body = Text(describe_root_cause(cause), style="bold")
        for line in cause.tail:
            body.append("\n  " + line, style="not bold")
        parts.append(Panel(body, title="root cause: the first failure", border_style="red"))
    elif snapshot.exit_code == 0:
        parts.append(Text("run succeeded", style="bold green"))
    if keys and snapshot.exit_code is None:
        parts.append(Text(CONFIRM, style="bold") if confirming else Text(KEYS, style="dim"))
    return Group(*parts)


def after_lines(event: RunFinished):
    """What is said under the last frame: a failed attempt that restarts (its root cause
    is in the frame), else where the logs are."""
    if event.restarting and event.root_cause is not None:
        return [restart_line(event)]
    return [logs_line(event)] if event.logs else []


class Dashboard:
    """A run listener that shows a rich Live view on a terminal."""

    def __init__(self, out: IO[str], by_rank: bool = False, on_stop: Optional[Callable[[], None]] = None,
                 on_detach: Optional[Callable[[], None]] = None, keys: bool = True,
                 refresh_per_second: float = 4):
        self.model = BoardModel(by_rank=by_rank)
        self.out = out
        self.console = Console(file=out, no_color=no_color() or None)
        self.on_stop = on_stop
        self.on_detach = on_detach
        self.keys = keys and (on_stop is not None or on_detach is not None) and sys.stdin.isatty()
        self._confirming = False          # [s] was pressed: the next key says yes or no
        self._plain: Optional[PlainView] = None   # after [q]: plain lines from here on
        self._live = Live(console=self.console, get_renderable=self._frame,
                          refresh_per_second=refresh_per_second, transient=False,
                          redirect_stdout=False, redirect_stderr=False)
        self._started = False
        self._typed: Optional[str] = None   # digits typed after `g`, until Enter
        self._closed = threading.Event()
        self._lock = threading.Lock()

    def _frame(self):
        return render(self.model.snapshot(), keys=self.keys, confirming=self._confirming)

    def __call__(self, event: object) -> None:
        if self._plain is not None:
            self._plain(event)
            return
        self.model.apply(event)
        with self._lock:
            if not self._started and not self._closed.is_set():
                self._started = True
                self._live.start()
                if self.keys:
                    threading.Thread(target=self._read_keys, daemon=True).start()
        if isinstance(event, RunFinished):
            self.close()
            for line in after_lines(event):   # below the last frame, kept in the scrollback
                self.console.print(f"multihost: {line}", highlight=False, soft_wrap=True)
        elif isinstance(event, Notice):  # said once, and it outlives the live view
            self.console.print(f"multihost: {event.host}: {event.text}", highlight=False)

    def say(self, text: str) -> None:
        if self._plain is not None:
            self._plain.say(text)
        else:
            self.console.print(f"multihost: {text}", highlight=False)

    def close(self) -> None:
        """The last frame, then the cursor on a line of its own: whatever is printed next
        (the reattach hint after [d], an error) starts on a fresh line. Idempotent."""
        with self._lock:
            if self._started and not self._closed.is_set():
                self._live.refresh()
                self._live.stop()
            self._closed.set()

    def quit_view(self) -> None:
        """[q]: the dashboard closes; the run is followed on, in plain lines."""
        self.close()
        self._plain = PlainView(self.out, sys.stderr)
        self._plain.say("dashboard closed; following the run in plain lines "
                        "(Ctrl-C stops the run)" if self.on_stop else
                        "dashboard closed; following in plain lines")

    def _read_keys(self) -> None:
        """Single keys without Enter, until the view closes; the terminal is restored."""
        import select
        import termios
        import tty

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        try:
            tty.setcbreak(fd)
            while not self._closed.is_set():
                ready, _, _ = select.select([fd], [], [], 0.2)
                if ready:
                    self._key(os.read(fd, 1).decode(errors="ignore"))
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)

    def _key(self, key: str) -> None:
        """1-9 pick one of the first nine rows at once; `g`, digits and Enter pick any
        row by its '#' (node rank, or rank with --by-rank); n/p step through them all."""
        if self._confirming:  # a stop is never one stray key away
            self._confirming = False
            if key in ("y", "Y") and self.on_stop:
                self.on_stop()
            return
        if self._typed is not None:
            if key.isdigit():
                self._typed += key
            elif key in ("\r", "\n") and self._typed:
                self.model.select_number(int(self._typed))
                self._typed = None
            elif key != "g":
                self._typed = None   # anything else (Esc) gives up
            return
        keys = self.model.keys()
        if key.isdigit() and key != "0" and int(key) <= len(keys):
            self.model.select(keys[int(key) - 1])
        elif key == "g":
            self._typed = ""
        elif key in ("n", "p"):
            self.model.step(1 if key == "n" else -1)
        elif key == "a":
            self.model.select(None)
        elif key == "s" and self.on_stop:
            self._confirming = True
        elif key == "d" and self.on_detach:
            self.on_detach()
        elif key == "q":
            self.quit_view()
