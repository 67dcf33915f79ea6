"""The host side of `multihost sync` (registered in ops.py): compare, receive,
and push. Stdlib only, Python 3.6+.

  sync.session   the sync of one host in one process: reads the controller's manifest
                 (only its length for a workdir that is not there yet),
                 answers the plan (sync_plan: what differs, by content), then reads
                 and applies the stream of what differs, or, given a relay request
                 instead, is this host's node of a relay chain (as sync.receive is).
                 One process, one round trip.
  sync_plan      the plan alone (stdin: the manifest; for dry runs and tests).
  sync.receive   stdin: a sync stream (sync_wire). Applies it, atomically per file,
                 forwarding it to the next hosts when it is a relay.
  sync.push      stdin: a list of files of this host's tree. Feeds them to the head of a
                 relay chain of other hosts, whose nodes the controller started
                 (for --sync-data: host to host, never via the controller).
"""
import json
import os
import signal
import struct
import sys
import time

from ..machine import machine_identity
from .. import owners
from .lock import Busy, Claim
from .lock_files import remove_marker
from .fs import FILE, LINK, UnsafePath, check_relpath, resolve_root
from .receiver import Progress, Receiver
from .pipe import grow_pipe
from .plan import NO_MANIFEST, absent_plan, make_plan, workdir_absent
from . import relay
from .wire import Reader, StreamError, Writer, read_next
from ..proto import OpError, reply

STDIN_BUFFER = 256 * 1024


def _root_of(request):
    return resolve_root(request["root"], request.get("base")), request.get("rank", 0)


class _Stop(BaseException):
    """A signal asked us to stop: unwind so the file being written is removed."""


def _on_signal(signum, frame):
    raise _Stop()


def _stdin():
    grow_pipe(sys.stdin)  # sshd keeps sending while we write a chunk
    return os.fdopen(sys.stdin.fileno(), "rb", buffering=STDIN_BUFFER, closefd=False)


def _catch_signals():
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _on_signal)


def _receive(root, rank, stdin, kids=(), magic=None, keys=None, claim=None, progress=False):
    """Apply the stream on stdin to root; reply with the results of this node and of
    every relay node below it. Returns the exit status. ``claim``: this process's hold
    on the workdir (sync_lock), given back as it ends; the tree is unmarked when this
    was the last part of the sync and all of it was applied."""
    try:
        return _apply(root, rank, stdin, kids, magic, keys, claim, progress)
    finally:
        if claim is not None:
            claim.give_back()


def _apply(root, rank, stdin, kids, magic, keys, claim, progress=False):
    try:
        receiver = Receiver(root, keys, claim)
        if progress:
            receiver.on_progress = Progress()
    except (OSError, ValueError) as exc:
        for kid in kids:
            kid.finish()
        reply({"ok": False, "error": "cannot open %s: %s" % (root, getattr(exc, "strerror", None) or exc),
               "fix": "check that the workdir's parent exists and is writable"})
        return 1
    reader = None
    try:
        reader = Reader(stdin, [kid.feed for kid in kids], magic)
        receiver.apply(reader)
        done = getattr(stdin, "done", None)
        if done is not None:  # a relay's upstream: the whole stream is read
            done()
        for kid in kids:  # the next hosts have it all: they finish while we do
            kid.end_input()
    except (StreamError, _Stop) as exc:
        receiver.finish()
        cause = str(exc) if isinstance(exc, StreamError) else "stopped by a signal"
        for kid in kids:
            kid.finish()
        reply({"ok": False, "error": "%s after %d bytes" % (cause, reader.received if reader else 0),
               "fix": "run the sync again: it completes what is missing"})
        return 1
    receiver.finish()
    if claim is not None:
        claim.finish(clean=not receiver.errors)
    nodes = {str(rank): receiver.result()}
    if claim is not None and claim.waited >= 1:
        nodes[str(rank)]["waited"] = [round(claim.waited, 1), claim.waited_for]
    for kid in kids:
        nodes.update(kid.finish())
    reply({"ok": True, "result": {"nodes": nodes}})
    return 0


def plan(request):
    return make_plan(request, sys.stdin.buffer.read())


def session(request):
    """The sync of one host in one process (``_session``); whatever way it ends, the
    workdir's claim is given back (its name in a shared workdir's lock with it)."""
    held = []
    try:
        return _session(request, held)
    finally:
        for claim in held:
            claim.give_back()


def _session(request, held):
    """The whole sync of one host in one process: a first line says whether the workdir
    exists; stdin carries the manifest (4-byte length, then zlib JSON), or for a workdir
    that does not exist only the number of its entries (NO_MANIFEST, then 4 bytes: every
    entry is added, nothing to compare); the plan is replied as one line; then stdin
    carries the sync stream, or a relay request (this process becomes the host's node
    of a chain: no second helper start), or ends (nothing to send, or a dry run)."""
    _catch_signals()
    stdin = _stdin()
    in_use = None  # a run's hold: this sync may find the tree as it is, never change it
    try:
        claim = None if request.get("dry_run") else _claim(request)
        held.extend([claim] if claim is not None else [])
    except Busy as busy:
        if busy.holder.get("kind") != "run":
            reply({"ok": False, "error": busy.text, "fix": busy.fix})
            return 1
        claim, in_use = None, busy
    except _Stop:
        return 1
    reply({"absent": workdir_absent(request), "machine": machine_identity()})
    try:
        head = stdin.read(4)
        length = struct.unpack(">I", head)[0] if len(head) == 4 else 0
        if length == NO_MANIFEST:
            count = stdin.read(4)
            if len(count) != 4:
                raise OpError("the controller stopped before its plan",
                              fix="run the sync again")
            plan = absent_plan(request, struct.unpack(">I", count)[0])
        else:
            plan = make_plan(request, stdin.read(length) if length else b"")
    except OpError as err:
        reply({"ok": False, "error": err.error, "fix": err.fix})
        return 1
    except _Stop:
        return 1
    if in_use is not None and not (_complete(plan) and not plan.get("gone")):
        reply({"ok": False, "error": in_use.text, "fix": in_use.fix})
        return 1
    keys = plan.pop("keys", None)  # for the end: the controller records them
    if claim is not None:  # the helpers that write after this session hold to it
        plan["gen"] = claim.gen
        if claim.waited >= 1:
            plan["waited"] = [round(claim.waited, 1), claim.waited_for]
    reply({"ok": True, "result": plan})
    try:
        kind, what = read_next(stdin)
    except StreamError as exc:
        reply({"ok": False, "error": "the controller sent %s" % exc, "fix": "run the sync again"})
        return 1
    except _Stop:
        return 1
    rank = request.get("rank", 0)
    if kind is None:  # nothing to send
        if claim is not None and _complete(plan):
            remove_marker(plan["root"])  # a sync cut after its last change: now known whole
        if keys is not None:
            reply({"ok": True, "result": {"nodes": {str(rank): {"keys": keys}}}})
        return 0
    if kind == "stream":
        return _receive(plan["root"], rank, stdin, magic=what, keys=keys, claim=claim)
    # This session is the host's relay node: for its own workdir and rank only, whatever
    # the request says (the plan's root is the one this host checked and resolved).
    if what["root"] != plan["root"] or what["rank"] != rank:
        reply({"ok": False, "error": "a relay request for %s (rank %s) reached the session of "
               "%s (rank %s)" % (what["root"], what["rank"], plan["root"], rank),
               "fix": "run the sync again"})
        return 1
    if claim is not None and what.get("part"):
        claim.part = what["part"]
    return _relay_node(plan["root"], rank, what["relay"], stdin, keys, claim)


def _claim(request):
    """This process's hold on the workdir (sync_lock), when the controller asks for one;
    while another sync holds it, say so on stdout (the controller reads on)."""
    spec = request.get("claim")
    if not isinstance(spec, dict):
        return None
    root = resolve_root(request["root"], request.get("base"))
    unsafe = owners.why_unsafe(root)
    if unsafe:  # she could swap the code between this sync and the launch
        raise Busy("the workdir %s is not only yours: %s" % (root, unsafe),
                   owners.fix_for(root, unsafe), {"error": True})
    return Claim(root, spec).take(lambda text: reply({"waiting": text}))


def _complete(plan):
    return not any(plan.get(k) for k in ("add", "change", "retype", "meta", "errors"))


def receive(request):
    _catch_signals()
    try:
        root, rank = _root_of(request)
    except (KeyError, ValueError, IndexError):
        reply({"ok": False, "error": "bad sync.receive request", "fix": "run the sync again"})
        return 1
    try:
        claim = _claim(request)
    except Busy as busy:
        reply({"ok": False, "error": busy.text, "fix": busy.fix})
        return 1
    except _Stop:
        return 1
    keys = {} if request.get("keys") else None
    spec = request.get("relay")
    if not isinstance(spec, dict):  # a direct stream
        return _receive(root, rank, _stdin(), keys=keys, claim=claim)
    return _relay_node(root, rank, spec, _stdin(), keys, claim)


def _relay_node(root, rank, spec, stdin, keys, claim=None):
    """This host's node of a relay chain (``spec``: its token, the hops after it, whether
    it listens for its upstream or reads the stream from ``stdin``): apply the stream to
    root and forward it. ``stdin`` ending before an upstream came means none will."""
    try:
        node = relay.Node(spec)
        stream = node.stream(stdin)
    except relay.RelayError as exc:
        if claim is not None:
            claim.give_back()
        reply({"ok": False, "error": str(exc), "fix": "the controller sends this host its files itself"})
        return 1
    try:
        return _receive(root, rank, stream, [node.downstream], keys=keys, claim=claim,
                        progress=bool(spec.get("progress")))
    finally:
        node.close()


def push(request):
    """Send files of this host's tree into a relay chain (``request["relay"]``: its
    token and the hops to try, head first). Its nodes are already started by the
    controller and listening; this is a node that only sends: ``ssh HEAD sync.join``,
    going around a head it cannot reach. stdin: JSON [[rel, size, mode, mtime_ns,
    sha256] or [rel, "l", target], ...]. Progress lines {"progress": bytes} go to stdout
    while sending, then the reply: what this host could not read, and the hosts it had
    to go around, with their causes."""
    root = resolve_root(request["root"], request.get("base"))
    files = json.loads(sys.stdin.buffer.read().decode("utf-8", "surrogateescape"))
    spec = request.get("relay")
    try:
        if not isinstance(spec, dict) or spec.get("listen"):
            raise relay.RelayError("bad sync.push request: run --sync-data again")
        head = relay.Node(spec).downstream
    except relay.RelayError as exc:
        reply({"ok": False, "error": str(exc), "fix": "run --sync-data again"})
        return 1
    writer = Writer(_Feed(head))
    state = {"sent": 0, "last": time.time()}

    def progress(count):
        state["sent"] += count
        now = time.time()
        if now - state["last"] > 0.5:
            state["last"] = now
            reply({"progress": state["sent"]})

    failed = []
    writer.record({"t": "begin"})
    for item in files:
        if head.proc is None or head.failure:  # no host to send to: the others say why
            break
        rel = item[0]
        try:
            if item[1] == LINK:
                writer.record({"t": LINK, "p": check_relpath(rel), "to": item[2]})
                continue
            _, size, mode, mtime, digest = item
            path = os.path.join(root, check_relpath(rel))
            writer.file({"t": FILE, "p": rel, "s": size, "m": mode, "mt": mtime, "h": digest},
                        path, progress)
        except (OSError, UnsafePath) as exc:
            failed.append([rel, getattr(exc, "strerror", None) or str(exc)])
    if head.proc is not None and not head.failure:
        writer.end()
    nodes = head.finish()
    reply({"ok": True, "result": {"nodes": nodes, "source_errors": failed}})
    return 0


class _Feed(object):
    def __init__(self, child):
        self.child = child

    def write(self, data):
        self.child.feed(data)
