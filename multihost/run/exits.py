"""How a process ended, in words and as the shell's status: ``exit 3``, ``killed by
SIGKILL (out of memory? ...)``, 128+N for a signal N; and which rank a launcher's last
lines say failed. Pure; outcome.py reads every rank's end with it, and the views and
``status`` say a rank's end the same way."""
from __future__ import annotations

import re
import signal as _signal
from typing import Optional, Sequence, Tuple

EXIT_STOPPED = 128 + _signal.SIGTERM   # the run was stopped from another shell

SIGNAL_NOTES = {
    _signal.SIGKILL: "out of memory? look for the OOM killer in `dmesg` on that host",
    _signal.SIGSEGV: "segmentation fault",
    _signal.SIGABRT: "aborted",
    _signal.SIGBUS: "bus error",
    _signal.SIGFPE: "arithmetic error",
    _signal.SIGILL: "illegal instruction",
}


def signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# On a node multihost stopped (stop, Ctrl-C, another rank's failure), its own signals
# are no mystery: a SIGKILL there is multihost's, not the OOM killer's.
STOPPED_NOTES = {
    _signal.SIGTERM: "stopped by multihost",
    _signal.SIGKILL: "multihost killed it after the --kill-wait grace: it ignored SIGTERM",
}


def decode_exit(exit_code: Optional[int], signal: Optional[int] = None,
                stopped: bool = False) -> str:
    """``exit 3``; ``killed by SIGKILL (out of memory? ...)``; ``exit 137 (killed by SIGKILL ...)``.
    ``stopped``: the node was stopped by multihost, which explains its SIGTERM and SIGKILL."""
    if signal is None and exit_code is not None and exit_code < 0:
        signal, exit_code = -exit_code, None   # subprocess's convention
    notes = {**SIGNAL_NOTES, **STOPPED_NOTES} if stopped else SIGNAL_NOTES
    if signal:
        note = notes.get(signal)
        return f"killed by {signal_name(signal)}" + (f" ({note})" if note else "")
    if exit_code is None:
        return "ended without an exit status"
    if 128 < exit_code <= 128 + 64:
        name = signal_name(exit_code - 128)
        if not name.startswith("signal "):
            note = notes.get(exit_code - 128)
            return f"exit {exit_code} (killed by {name}" + (f"; {note})" if note else ")")
    return f"exit {exit_code}"


def exit_status(exit_code: Optional[int], signal: Optional[int] = None) -> int:
    """The shell's view: a signal N becomes 128+N; a failure never reads as 0."""
    if signal is None and exit_code is not None and exit_code < 0:
        signal = -exit_code
    if signal:
        return 128 + signal
    if not exit_code:
        return 1
    return exit_code & 0xFF or 1


_PADDLE_FAILED = re.compile(r"Container rank (\d+) status failed .*?\bcode (-?\d+)")
_TORCH_RANK = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: (\d+)\)")
_TORCH_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def launcher_failure(lines: Sequence[str]) -> Optional[Tuple[int, int]]:
    """(local rank, exit code) of the failed rank, from a launcher's last lines, when a
    node has no rank records of its own (paddle, or a template without {rank_log...})."""
    text = list(lines)
    for line in text:
        match = _PADDLE_FAILED.search(line)
        if match:
            return int(match.group(1)), int(match.group(2))
    if any("Root Cause" in line for line in text):
        after = text[max(i for i, line in enumerate(text) if "Root Cause" in line):]
        local = code = None
        for line in after:
            rank_match, code_match = _TORCH_RANK.match(line), _TORCH_CODE.match(line)
            local = int(rank_match.group(2)) if rank_match and local is None else local
            code = int(code_match.group(1)) if code_match and code is None else code
        if local is not None and code is not None:
            return local, code
    return None
