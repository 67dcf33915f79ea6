"""Stream a run's log files from given byte offsets: the host side of `multihost logs`.

Frames on stdout, each a header line and, for data, the raw bytes that follow it:
  ``D <name> <offset> <length>``  then exactly <length> bytes of file <name> at <offset>
  ``Z <name> <offset> <length> <packed>``  the same bytes, zlib-compressed to <packed>
                                  (asked for with "compress": logs shrink 5-10x, and
                                  the controller's SSH stack is slower per byte than zlib)
  ``S <json>``                    node.json changed (the node's state)
  ``H <time>``                    heartbeat, so the controller can tell a dead link
  ``E <json>``                    everything is sent and the node has finished: the end
Data is cut at the last newline so that lines are never split between frames, except
at the end of a finished node (a last line without newline) or a line longer than a chunk.
The controller resumes from the sizes of its mirror files: nothing is lost or repeated.
"""
import json
import os
import sys
import time
import zlib

from .proto import op
from .run_states import FINAL_STATES

CHUNK = 1 << 20


def _log_files(run_dir):
    """Every file worth streaming: the launcher's output and one log per local rank."""
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

    def frame(self, header, payload=b""):
        self.out.write(header.encode("utf-8") + b"\n" + payload)

    def data(self, name, offset, data):
        if self.compress and len(data) >= 4096:
            packed = zlib.compress(data, 1)
            if len(packed) < len(data) * 0.8:
                self.frame("Z %s %d %d %d" % (name, offset, len(data), len(packed)), packed)
                return
        self.frame("D %s %d %d" % (name, offset, len(data)), data)

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
                if cut == 0 and not final and len(data) < CHUNK:
                    break  # a line still being written: wait for its end
                if cut and not (final and cut < len(data)):
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
    run_dir = os.path.expanduser(request["run_dir"])
    follow = bool(request.get("follow", True))
    interval = float(request.get("interval", 0.1))
    heartbeat = float(request.get("heartbeat", 2.0))
    wait_for_dir = float(request.get("wait_for_dir", 30.0))
    out = sys.stdout.buffer
    streamer = Streamer(out, run_dir, request.get("offsets") or {},
                        compress=bool(request.get("compress")))
    started = time.time()
    while not os.path.isdir(run_dir):
        if not follow or time.time() - started > wait_for_dir:
            streamer.frame("E " + json.dumps({"error": "no run directory %s" % run_dir}))
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
                streamer.frame("S " + json.dumps(state))
                out.flush()
                last_state = state
            if not follow:  # one pass over what is there now: a busy rank never ends it
                streamer.frame("E " + json.dumps(state))
                out.flush()
                return 0
            if not sent and finished:
                streamer.sweep(final=True)
                streamer.frame("E " + json.dumps(state))
                out.flush()
                return 0
            now = time.time()
            if now - last_beat >= heartbeat:
                streamer.frame("H %.3f" % now)
                out.flush()
                last_beat = now
            if not sent:
                time.sleep(interval)
    except (BrokenPipeError, IOError):
        return 0  # the controller went away; the files are all still here
