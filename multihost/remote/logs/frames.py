"""The wire format of ``logs.tail``: written by the host (ops.py) and read by the
controller (logs/follow.py), so that both sides share one definition of it, as sync
shares sync_wire. Stdlib only, Python 3.6+ (this runs on the hosts).

Frames, each a header line and, for data, the raw bytes that follow it:
  ``D <name> <offset> <length>``  then exactly <length> bytes of file <name> at <offset>
  ``Z <name> <offset> <length> <packed>``  the same bytes, zlib-compressed to <packed>
                                  (asked for with "compress": logs shrink 5-10x, and
                                  the controller's SSH stack is slower per byte than zlib)
  ``S <json>``                    node.json changed (the node's state)
  ``H <time>``                    heartbeat, so the controller can tell a dead link
  ``E <json>``                    everything is sent and the node has finished: the end
"""
import collections
import json
import zlib

DATA = "D"
PACKED = "Z"
STATE = "S"
HEARTBEAT = "H"
END = "E"

COMPRESS_FROM = 4096     # smaller data is not worth zlib's time
COMPRESS_GAIN = 0.8      # send packed only when it saves at least a fifth


# kind: DATA (a packed frame arrives unpacked), STATE, END, HEARTBEAT or what came;
# name, offset, data: for DATA; body: the rest of the header line for the others.
Frame = collections.namedtuple("Frame", "kind name offset data body")


# -- the host side ----------------------------------------------------------------------
def frame(header, payload=b""):
    return header.encode("utf-8") + b"\n" + payload


def data_frame(name, offset, data, compress=False):
    """File bytes at ``offset``, zlib-packed when asked and when it pays."""
    if compress and len(data) >= COMPRESS_FROM:
        packed = zlib.compress(data, 1)
        if len(packed) < len(data) * COMPRESS_GAIN:
            return frame("%s %s %d %d %d" % (PACKED, name, offset, len(data), len(packed)), packed)
    return frame("%s %s %d %d" % (DATA, name, offset, len(data)), data)


def state_frame(state):
    return frame(STATE + " " + json.dumps(state))


def end_frame(state):
    return frame(END + " " + json.dumps(state))


def heartbeat_frame(now):
    return frame("%s %.3f" % (HEARTBEAT, now))


# -- the controller side ----------------------------------------------------------------
# The controller reads what a host sends as untrusted input: every field is checked
# against the format above, sizes are bounded, and a packed frame is unpacked no further
# than its stated size (no zip bomb). The caller decides which file names it accepts.
MAX_HEADER = 4096           # bytes of a header line; a real one is under 100
MAX_FRAME = 16 << 20        # bytes of one frame's data; the helper sends at most 1 MiB


class BadFrame(ValueError):
    """A frame that is not what the format defines; its message says what came."""


def _number(text):
    if not (text.isdigit() and len(text) <= 15 and text.strip("0123456789") == ""):
        raise BadFrame("a malformed frame header (%r is not a size or offset)" % text[:40])
    return int(text)


def read_frame(stream, name_ok=lambda name: True):
    """The next frame of a binary stream; None when the stream ended between frames;
    BadFrame for anything malformed, EOFError for a stream cut inside a frame."""
    header = stream.readline(MAX_HEADER)
    if not header:
        return None
    if not header.endswith(b"\n"):
        if len(header) >= MAX_HEADER:
            raise BadFrame("a frame header longer than %d bytes" % MAX_HEADER)
        raise EOFError("log stream ended inside a frame header")
    try:
        text = header[:-1].decode("utf-8")
    except UnicodeDecodeError:
        raise BadFrame("a frame header that is not UTF-8 text")
    kind, _, rest = text.partition(" ")
    if kind in (DATA, PACKED):
        return _data_frame(stream, kind, rest, name_ok)
    if kind in (STATE, END):
        try:
            json.loads(rest)
        except ValueError:
            raise BadFrame("a %s frame whose record is not JSON: %r" % (kind, rest[:200]))
        return Frame(kind, None, None, None, rest)
    if kind == HEARTBEAT:
        return Frame(kind, None, None, None, rest)
    raise BadFrame("an unknown frame %r" % text[:200])


def _data_frame(stream, kind, rest, name_ok):
    fields = rest.split(" ")
    if len(fields) != (3 if kind == DATA else 4):
        raise BadFrame("a malformed frame header %s %r" % (kind, rest[:200]))
    name = fields[0]
    offset, length = _number(fields[1]), _number(fields[2])
    packed = _number(fields[3]) if kind == PACKED else length
    if not name_ok(name):
        raise BadFrame("a log frame for %r, which is not a log file of a run" % name[:200])
    if length > MAX_FRAME or packed > MAX_FRAME:
        raise BadFrame("a log frame of %d bytes (at most %d)" % (max(length, packed), MAX_FRAME))
    data = read_exact(stream, packed)
    if kind == PACKED:
        inflater = zlib.decompressobj()
        try:
            data = inflater.decompress(data, length + 1)   # bounded: no zip bomb
        except zlib.error:
            data = b""
        if len(data) != length or not inflater.eof:
            raise BadFrame("a log frame that arrived damaged (it does not unpack to its "
                           "stated size)")
    return Frame(DATA, name, offset, data, None)


def state_of(frame_):
    """The node record a STATE or END frame carries (None when there is none yet)."""
    return json.loads(frame_.body)


def read_exact(stream, length):
    chunks, left = [], length
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("log stream ended inside a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
