"""A node's part of a run as a Slurm job step that lasts as long as the run.

Over ssh, ``run.launch`` starts a detached supervisor and returns. Under Slurm that
supervisor would escape the srun step that started it: with proctrack/cgroup Slurm kills
it as soon as that step ends, with proctrack/linuxproc Slurm loses track of it (scancel
and the end of the allocation would leave the ranks running). So on a node reached by
srun, the launch is ``slurm.launch`` (remote/run/slurm.py) started as a stream: its first
line is the same reply, and the step (the srun kept here) then lasts until the node's
supervisor ends, with its exit status as the step's.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Tuple

from .. import helper
from ..errors import CommandTimeout
from ..transport import Process, Transport

OP = "slurm.launch"


def keeps_steps(transport: Transport) -> bool:
    """Is this node reached by srun (so its launch must be a kept step)?"""
    from ..transport.srun import SrunTransport

    return isinstance(transport, SrunTransport)


def launch_kept(transport: Transport, run_id: str, payload: bytes,
                timeout: float) -> Tuple[Dict[str, Any], Process]:
    """Start the node's step; return the launch reply and the running step (its srun).
    The step is ended by the run's own stop, scancel, or the allocation's end."""
    process = helper.launch(transport, OP, {"run_id": run_id})
    first: Dict[str, bytes] = {}

    def read() -> None:
        try:
            first["line"] = process.stdout.readline()
        except OSError:
            first["line"] = b""

    try:
        process.stdin.write(payload)
        process.stdin.close()
        reader = threading.Thread(target=read, daemon=True, name=f"launch-{transport.host.label}")
        reader.start()
        reader.join(timeout)
        if reader.is_alive():
            raise CommandTimeout(f"the launch did not answer within {timeout:.0f}s",
                                 host=transport.host.label,
                                 fix="see the run's supervisor.log on that node")
        line = first.get("line") or b""
        if not line.strip():
            code = process.wait(30)
            return helper.parse_reply(transport, OP, code, b"", process.read_stderr()), process
        return helper.parse_reply(transport, OP, 0, line, b""), process
    except BaseException:
        process.kill()
        raise
