"""Stream a run's log files from given byte offsets: the host side of `multihost logs`.

Frames on stdout, in the format of frames.py (data, state, heartbeat, end).
Data is cut at the last newline so that lines are never split between frames, except
at the end of a finished node (a last line without newline), a line longer than a chunk,
and a line being redrawn with \r (a progress bar: its states are shown as they come).
The controller resumes from the sizes of its mirror files: nothing is lost or repeated.
"""
import json
import os
import sys
import time

from . import frames as log_frames
from ..proto import op
from ..run import files as run_files
from ..run.states import FINAL_STATES

CHUNK = 1 << 20
QUICK_TICK = 0.025   # in a stream's first ``quick_for`` seconds, as run.watch does


def _log_files(run_dir):
    """Every file worth streaming: the launcher's output, one log per local rank, and
    the GPU samples."""
    names = []
    log_dir = os.path.join(run_dir, "log")
    try:
        # paddle also writes envlog.N and endpoints.log there: not rank output
        names = ["log/" + n for n in sorted(os.listdir(log_dir))
                 if n.startswith(("workerlog.", "serverlog."))]
    except OSError:
        pass
    if os.path.exists(os.path.join(run_dir, "launcher.log")):
        names.insert(0, "launcher.log")
    if os.path.exists(os.path.join(run_dir, "gpu.log")):  # the GPU sampler's (remote/run/gpus.py)
        names.append("gpu.log")
    return names


def _read_state(run_dir):
    try:
        with open(os.path.join(run_dir, "node.json")) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


class Streamer(object):
    def __init__(self, out, run_dir, offsets, compress=False):
        self.out = out
        self.run_dir = run_dir
        self.offsets = dict(offsets)
        self.compress = compress

    def data(self, name, offset, data):
        self.out.write(log_frames.data_frame(name, offset, data, self.compress))

    def sweep(self, final):
        """Send what is new in every file; returns the number of bytes sent.

        The launcher's size is read first and its data sent last: whatever it copied
        from workerlog.0 (paddle echoes local rank 0) then reaches the controller after
        the rank's own line, which lets the controller show each line once."""
        sent = 0
        sizes = []
        for name in _log_files(self.run_dir):
            try:
                sizes.append((name, os.path.getsize(os.path.join(self.run_dir, name))))
            except OSError:
                continue
        sizes.sort(key=lambda item: item[0] == "launcher.log")  # stable: ranks first
        for name, size in sizes:
            path = os.path.join(self.run_dir, name)
            offset = self.offsets.get(name, 0)
            while size > offset:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read(min(size - offset, CHUNK))
                cut = data.rfind(b"\n") + 1
                # A line redrawn with \r (a progress bar) goes out as it is drawn: each
                # state is one write of the job's, and the controller joins the line.
                bar = data.find(b"\r", cut) >= 0
                if cut == 0 and not (final or bar) and len(data) < CHUNK:
                    break  # a line still being written: wait for its end
                if cut and not (final or bar):
                    data = data[:cut]
                self.data(name, offset, data)
                offset += len(data)
                sent += len(data)
            self.offsets[name] = offset
        if sent:
            self.out.flush()
        return sent


@op("logs.tail", stream=True)
def tail(request):
    # By run id: this host's own run directory (its own below a shared home).
    run_dir = run_files.run_dir(request["run_id"]) if request.get("run_id") \
        else os.path.expanduser(request["run_dir"])
    follow = bool(request.get("follow", True))
    interval = float(request.get("interval", 0.1))
    heartbeat = float(request.get("heartbeat", 2.0))
    quick_for = float(request.get("quick_for") or 0)
    wait_for_dir = float(request.get("wait_for_dir", 30.0))
    out = sys.stdout.buffer
    streamer = Streamer(out, run_dir, request.get("offsets") or {},
                        compress=bool(request.get("compress")))
    started = time.time()
    while not os.path.isdir(run_dir):
        if not follow or time.time() - started > wait_for_dir:
            out.write(log_frames.end_frame({"error": "no run directory %s" % run_dir}))
            out.flush()
            return 1
        time.sleep(interval)
    last_state = None
    last_beat = 0.0
    try:
        while True:
            state = _read_state(run_dir)
            finished = bool(state) and state.get("state") in FINAL_STATES
            # A last line without its newline goes out only once its rank has finished:
            # a live rank is still writing it, and a cut line would show as two.
            sent = streamer.sweep(final=finished)
            if state != last_state:
                out.write(log_frames.state_frame(state))
                out.flush()
                last_state = state
            if not follow:  # one pass over what is there now: a busy rank never ends it
                out.write(log_frames.end_frame(state))
                out.flush()
                return 0
            if not sent and finished:
                streamer.sweep(final=True)
                out.write(log_frames.end_frame(state))
                out.flush()
                return 0
            now = time.time()
            if now - last_beat >= heartbeat:
                out.write(log_frames.heartbeat_frame(now))
                out.flush()
                last_beat = now
            if not sent:
                time.sleep(min(interval, QUICK_TICK) if now - started < quick_for
                           else interval)
    except (BrokenPipeError, IOError):
        return 0  # the controller went away; the files are all still here
