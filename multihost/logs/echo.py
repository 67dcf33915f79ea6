"""Each line once: paddle's launcher copies local rank 0's log into its own output, and
prints the same block of its configuration on every host; torchrun answers the SIGTERM
of every stop with a 20-line traceback, shown as one line.

``python -m paddle.distributed.launch`` writes every rank's output to
``workerlog.N`` and also echoes ``workerlog.0``, line by line and in order, to its own
stdout (our ``launcher.log``), between its own messages. Shown as they are, local rank
0's lines appear twice in the live view and in ``logs``: once as ``[0]`` and once as
``[launcher]``. The files stay as they are (the mirror is byte for byte); only what is
shown skips the copies.

The host's log stream sends a sweep's worker logs before the launcher's output, and
reads the launcher's size first (``remote/logs/ops.py``), so every echoed line has
already been seen in ``workerlog.0`` when it arrives here: a launcher line equal to the
oldest rank-0 line not yet echoed is that echo. Anything else is the launcher's own.
"""
from __future__ import annotations

import re
from collections import deque
from typing import Deque, Optional

# Rank-0 lines kept for matching. A launcher that never echoes (torchrun) only fills
# this up; the oldest lines go first, so memory stays bounded per host.
KEEP_LINES = 20000


class LauncherEcho:
    """One host's filter: ``rank0`` takes local rank 0's text as it arrives; ``launcher``
    returns the launcher's text without the copies (None when nothing is left)."""

    def __init__(self, keep: int = KEEP_LINES):
        self._not_echoed: Deque[str] = deque(maxlen=keep)

    def rank0(self, text: str) -> None:
        self._not_echoed.extend(text.split("\n"))

    def launcher(self, text: str) -> Optional[str]:
        kept = []
        for line in text.split("\n"):
            if self._not_echoed and line == self._not_echoed[0]:
                self._not_echoed.popleft()
                continue
            kept.append(line)
        return "\n".join(kept) if kept else None


# paddle.distributed.launch's Context.print(): a header, one `arg: value` line per argument
# (about 35), a closing line of dashes; the same on every host but for the node's rank.
CONFIG_START = re.compile(r"LAUNCH INFO .*-{5,}\s*Configuration\s*-{5,}\s*$")
CONFIG_END = re.compile(r"LAUNCH INFO .*\s-{20,}\s*$")


class ConfigBlock:
    """For every host but the first: the launcher's configuration block left out of what is
    shown (it is node 0's, with another rank), so a 2-host job shows it once, not twice."""

    def __init__(self) -> None:
        self._inside = False

    def strip(self, text: str) -> Optional[str]:
        kept = []
        for line in text.split("\n"):
            if self._inside:
                self._inside = not CONFIG_END.search(line)
            elif CONFIG_START.search(line):
                self._inside = True
            else:
                kept.append(line)
        return "\n".join(kept) if kept else None


# torchrun's agent raises SignalException on the SIGTERM a stop sends it, and dies with
# the whole traceback: about 20 lines per host that say only "stopped".
SIGNAL_TRACE = re.compile(r"^Traceback \(most recent call last\):\n(?:[ \t].*\n)+"
                          r"\S*SignalException: Process (\d+) got signal: 15[ \t]*$", re.M)


def fold_signal_trace(text: str) -> str:
    """A launcher's text with torchrun's traceback for SIGTERM as one line (the mirror
    keeps it whole). A traceback split across two blocks is left as it is."""
    def one_line(match: "re.Match[str]") -> str:
        lines = match.group(0).count("\n") + 1
        return (f"torchrun (pid {match.group(1)}) stopped by SIGTERM; its {lines}-line "
                "traceback is in the log mirror")
    return SIGNAL_TRACE.sub(one_line, text) if "SignalException" in text else text
