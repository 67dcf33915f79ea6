"""The sync stream: one byte stream per receiver carrying every change, so that two
thousand small files cost one round trip, not two thousand. Stdlib only, Python 3.6+.

The stream is the magic line, then records. A record is a 4-byte big-endian length, a
JSON header of that length, and for a file exactly ``s`` bytes of content:

  {"t": "begin", ...}                            options for the receiver
  {"t": "tracked", "s": SIZE} + content          the paths a sync owns on the receiver
                                                 from now on: zlib of "\0"-joined paths
  {"t": "d", "p": PATH, "m": MODE}               a directory
  {"t": "x", "p": PATH}                          delete (file, link, or empty directory)
  {"t": "f", "p": PATH, "s": SIZE, "m": MODE, "mt": MTIME_NS, "h": SHA256} + content
  {"t": "l", "p": PATH, "to": TARGET}            a symlink, kept as a link
  {"t": "meta", "p": PATH, "m": MODE, "mt": MTIME_NS}   same content, new mode or time
  {"t": "end"}                                   the sender finished: apply and reply

A stream cut before "end" (the sender was killed) is a failed transfer: the receiver
drops the file it was writing and keeps every file it had already renamed into place.

A host's ``sync.session``, once its plan is answered, gets one of two things on the same
stdin, told apart by their first 8 bytes (``read_next``, the one place that parses
them): a sync stream (MAGIC), or a relay request (NODE_MAGIC, a 4-byte big-endian
length, then that much JSON: ``{"root", "rank", "keys", "relay"}``, what a relay node's
``sync.receive`` gets in argv), which makes the session that host's node of a chain.
"""
import json
import os
import struct
import zlib

MAGIC = b"MHSYNC1\n"
NODE_MAGIC = b"MHNODE1\n"  # as long as MAGIC: one read tells them apart
MAX_HEADER = 1 << 20
MAX_NODE_REQUEST = 64 * 1024  # a request names at most a few hops: a few KB
CHUNK = 1 << 20
_LENGTH = struct.Struct(">I")


class StreamError(Exception):
    """The stream is cut or malformed."""


def encode(header):
    body = json.dumps(header, separators=(",", ":")).encode("utf-8", "surrogateescape")
    return _LENGTH.pack(len(body)) + body


class Writer(object):
    """Writes records to ``out`` (anything with write()); counts what it sent."""

    def __init__(self, out):
        self.out = out
        self.sent = 0
        self._write(MAGIC)

    def _write(self, data):
        self.out.write(data)
        self.sent += len(data)

    def record(self, header):
        self._write(encode(header))

    def file(self, header, path, progress=None):
        """A file record whose content is read from ``path``: exactly header["s"] bytes
        are sent even if the file changed meanwhile (short: zero padding). The receiver
        compares the hash and refuses a file that changed."""
        size = header["s"]
        # Open first: a file that cannot be read is skipped before its record starts.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        left = size
        try:
            self.record(header)
            while left:
                try:
                    data = os.read(fd, min(CHUNK, left))
                except OSError:
                    data = b""  # unreadable: padded below, refused by the hash check
                if not data:
                    break
                self._write(data)
                left -= len(data)
                if progress is not None:
                    progress(len(data))
        finally:
            os.close(fd)
        while left:
            pad = b"\0" * min(CHUNK, left)
            self._write(pad)
            left -= len(pad)
            if progress is not None:
                progress(len(pad))

    def tracked(self, paths):
        """The paths a sync owns on the receiver (only those are ever deleted there).
        Compressed, as content: 100,000 paths would not fit in a header (MAX_HEADER), and
        every host of a first sync gets the same list."""
        body = zlib.compress("\0".join(paths).encode("utf-8", "surrogateescape"), 6)
        self.record({"t": "tracked", "s": len(body)})
        self._write(body)

    def end(self):
        self.record({"t": "end"})


class Reader(object):
    """Reads records from a binary stream. Every byte read is also passed to each
    function in ``tees`` (a relay forwards the stream as it arrives)."""

    def __init__(self, stream, tees=(), magic=None):
        """``magic``: the first bytes, when the caller already read them."""
        self.stream = stream
        self.tees = list(tees)
        self.received = 0
        if magic is None:
            magic = self._read(len(MAGIC))
        if magic != MAGIC:
            raise StreamError("not a multihost sync stream (got %r)" % magic[:16])

    def _read(self, count):
        parts = []
        while count:
            data = self.stream.read(min(count, CHUNK))
            if not data:
                raise StreamError("the stream ended early: the sender stopped")
            parts.append(data)
            count -= len(data)
            self.received += len(data)
            for tee in self.tees:
                tee(data)
        return b"".join(parts) if len(parts) != 1 else parts[0]

    def header(self):
        (length,) = _LENGTH.unpack(self._read(_LENGTH.size))
        if length > MAX_HEADER:
            raise StreamError("record header of %d bytes: the stream is corrupt" % length)
        try:
            header = json.loads(self._read(length).decode("utf-8", "surrogateescape"))
        except ValueError:
            raise StreamError("unreadable record header: the stream is corrupt")
        if not isinstance(header, dict) or "t" not in header:
            raise StreamError("record without a type: the stream is corrupt")
        return header

    def content(self, size):
        """Yield a file's content in chunks of at most CHUNK bytes."""
        left = size
        while left:
            data = self._read(min(CHUNK, left))
            left -= len(data)
            yield data

    def tracked(self, header):
        """The paths of a "tracked" record (after its header)."""
        size = header.get("s")
        if not isinstance(size, int) or size < 0:
            raise StreamError("a list of tracked paths without a size: the stream is corrupt")
        try:
            text = zlib.decompress(b"".join(self.content(size))).decode("utf-8", "surrogateescape")
        except zlib.error:
            raise StreamError("unreadable list of tracked paths: the stream is corrupt")
        return text.split("\0") if text else []

    def skip(self, size):
        for _ in self.content(size):
            pass


def encode_node_request(request):
    """A relay request for a session (``read_next`` reads it back)."""
    body = json.dumps(request, separators=(",", ":")).encode("utf-8", "surrogateescape")
    if len(body) > MAX_NODE_REQUEST:
        raise ValueError("a relay request of %d bytes" % len(body))
    return NODE_MAGIC + _LENGTH.pack(len(body)) + body


def read_next(stream):
    """What a session gets after its plan: ``("stream", MAGIC)`` (the stream's records
    follow), ``("node", request)`` (a checked relay request), or ``(None, None)`` when
    the input ended (nothing to send). Anything else is a StreamError, before a byte
    of it is acted on."""
    tag = _read_exactly(stream, len(MAGIC), allow_empty=True)
    if not tag:
        return None, None
    if tag == MAGIC:
        return "stream", tag
    if tag != NODE_MAGIC:
        raise StreamError("neither a sync stream nor a relay request (got %r)" % tag[:16])
    (length,) = _LENGTH.unpack(_read_exactly(stream, _LENGTH.size))
    if length > MAX_NODE_REQUEST:
        raise StreamError("a relay request of %d bytes (at most %d)" % (length, MAX_NODE_REQUEST))
    try:
        request = json.loads(_read_exactly(stream, length).decode("utf-8", "surrogateescape"))
    except ValueError:
        raise StreamError("unreadable relay request")
    return "node", _checked_node_request(request)


def _read_exactly(stream, count, allow_empty=False):
    data = b""
    while len(data) < count:
        more = stream.read(count - len(data))
        if not more:
            if allow_empty and not data:
                return b""
            raise StreamError("the relay request ended early: the controller stopped")
        data += more
    return data


def _checked_node_request(request):
    """The request's fields, each of the type a relay node needs; the relay spec's own
    contents are checked by the node (sync_relay.Node)."""
    if not isinstance(request, dict):
        raise StreamError("a relay request that is not an object")
    wanted = (("root", str), ("rank", int), ("keys", bool), ("relay", dict))
    for name, kind in wanted:
        value = request.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise StreamError("a relay request whose %r is not a %s" % (name, kind.__name__))
    spec = request["relay"]
    if not isinstance(spec.get("token"), str) or not isinstance(spec.get("next", []), list) \
            or not isinstance(spec.get("listen", False), bool):
        raise StreamError("a relay request with a malformed relay spec")
    return request
