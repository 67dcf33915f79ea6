"""The chain of ``sync.push`` (``--sync-data``): the first host sends files of its own
tree to the others, each hop started by the one before it with the host's own ``ssh``,
running ``sync.receive`` there. (A code sync's chain is set up concurrently by the
controller instead: ``sync_relay.py``.) A hop that cannot be reached, or breaks off,
is reported with its cause and every host after it as not reached; the controller then
sends those hosts their files itself.
"""
import json
import shlex
import subprocess
import threading

from .sync_fs import grow_pipe

FLUSH_AT = 256 * 1024


def hop_request(hops, index, extra=None):
    request = {"hops": hops, "index": index}
    if extra:
        request.update(extra)
    return request


class Child(object):
    """The helper on the next host, started over ssh, fed with every byte we read."""

    def __init__(self, hops, index, extra=None):
        self.hops = hops
        self.index = index
        hop = hops[index]
        self.rank = hop["rank"]
        self.name = hop.get("name", str(hop["rank"]))
        request = json.dumps(hop_request(hops, index, extra), separators=(",", ":"))
        argv = list(hop["ssh"]) + [hop["line"] + " " + shlex.quote(request)]
        self.failure = None
        self.stderr = b""
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            self.proc = None
            self.failure = "cannot start ssh to %s: %s" % (self.name, exc.strerror)
            return
        self.pending = bytearray()
        grow_pipe(self.proc.stdin)  # we write a whole chunk and go on with our own
        self._stderr_reader = threading.Thread(target=self._read_stderr)
        self._stderr_reader.daemon = True
        self._stderr_reader.start()

    def _read_stderr(self):
        self.stderr = self.proc.stderr.read()

    def feed(self, data):
        """Forward bytes; small pieces (record headers, small files) are gathered into
        large writes, so the next host sees a few big ssh packets, not many tiny ones."""
        if self.failure is not None:
            return
        if not self.pending and len(data) >= FLUSH_AT:
            self._write(data)
            return
        self.pending += data
        if len(self.pending) >= FLUSH_AT:
            self.flush()

    def flush(self):
        if self.pending and self.failure is None:
            self._write(bytes(self.pending))
        self.pending = bytearray()

    def _write(self, data):
        try:
            self.proc.stdin.write(data)
        except (OSError, ValueError):
            self.failure = "the relay to %s broke off" % self.name

    def end_input(self):
        """Everything is sent: let the child finish while we finish our own writes."""
        if self.proc is not None and not self.proc.stdin.closed:
            self.flush()
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def finish(self):
        """{rank: result or {"error": ...}} for this child and everything below it."""
        out = b""
        code = None
        if self.proc is not None:
            self.end_input()
            out = self.proc.stdout.read()
            code = self.proc.wait()
            self._stderr_reader.join(5)
        reply = _last_json(out)
        if isinstance(reply, dict) and reply.get("ok") and isinstance(reply.get("result"), dict):
            nodes = reply["result"].get("nodes")
            if isinstance(nodes, dict):
                return nodes
        cause = self._cause(code, reply)
        if self.failure and code not in (97, 255):
            detail = self._stderr_line()
            cause = self.failure + (": " + detail if detail else " (exit %s)" % code)
        nodes = {}
        for j in range(self.index, len(self.hops)):
            hop = self.hops[j]
            if j == self.index:
                nodes[str(hop["rank"])] = {"error": cause, "relay": True}
            else:
                nodes[str(hop["rank"])] = {"error": "not reached: the relay through %s failed"
                                           % self.name, "relay": True}
        return nodes

    def _stderr_line(self):
        err = self.stderr.decode("utf-8", "replace").strip().splitlines()
        return err[-1] if err else ""

    def _cause(self, code, reply):
        if isinstance(reply, dict) and reply.get("error"):
            return "%s: %s" % (self.name, reply["error"])
        last = self._stderr_line()
        if code == 97:
            return "the multihost helper is not installed on %s" % self.name
        if code == 255:
            return "host-to-host ssh to %s failed: %s" % (self.name, last or "exit 255")
        return "relay to %s ended with exit %s%s" % (self.name, code, (": " + last) if last else "")


def _last_json(out):
    for line in reversed(out.decode("utf-8", "replace").strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def start_children(request):
    """The next hop of this node (none for a direct, non-relayed stream)."""
    hops = request.get("hops")
    if not hops:
        return []
    index = int(request.get("index", 0))
    extra = dict((k, v) for k, v in request.items() if k not in ("hops", "index"))
    return [Child(hops, index + 1, extra)] if index + 1 < len(hops) else []
