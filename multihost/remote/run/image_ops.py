"""Operations on a host's container engine for ``run --image`` and ``check --image``.

image.facts   the engine, its version, rootless or not, the GPU runtime, the image's
              id (None: not here) and every multihost container left on the host.
              A host without an engine answers so (with the fix), not with an error:
              check shows it as its row.
image.pull    ``engine pull IMAGE``; the image's id.
image.load    a stream: ``engine load`` reads stdin (``engine save`` on the controller).
image.clean   kill and remove the containers of one run here, by their label.
"""
import subprocess
import sys

from . import container
from ..proto import OpError, op

PULL_TIMEOUT = 3600
CHUNK = 1 << 20


def _engine(request):
    try:
        return container.find_engine(request.get("engine") or None)
    except container.ContainerError as err:
        raise OpError(err.text, err.fix)


def _gpu_runtime(facts):
    if not facts.get("gpus"):
        return ""
    if facts["engine"] == "podman":
        return "cdi (%d devices)" % len(facts.get("cdi") or ()) if facts.get("cdi") else "none"
    return "--gpus"


@op("image.facts")
def facts(request):
    return describe(request.get("image"), request.get("engine"))


def describe(image, engine=None):
    """The engine here and the image: also the check's ``image`` probe."""
    try:
        found = container.host_facts(engine or None)
    except container.ContainerError as err:
        return {"engine": None, "error": err.text, "fix": err.fix}
    return {"engine": found["engine"], "version": found.get("version") or "",
            "rootless": bool(found.get("rootless")), "user": found.get("user"),
            "gpu_runtime": _gpu_runtime(found), "gpus": len(found.get("gpus") or ()),
            "image_id": container.image_id(found["path"], image) if image else None,
            "leftovers": _left_over(container.leftovers(found["path"]))}


def _left_over(found):
    """The containers whose run no longer holds this host (its supervisor is gone)."""
    from ..registry import holds

    live = {entry["run_id"] for entry in holds.read_all() if entry.get("live")}
    return [c for c in found if c["run"] not in live]


@op("image.pull")
def pull(request):
    engine, path = _engine(request)
    image = request["image"]
    try:
        done = subprocess.run([path, "pull", image], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                              timeout=PULL_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise OpError("`%s pull %s` took over %d s" % (engine, image, PULL_TIMEOUT),
                      "multihost run --image %s --image-from-controller" % image)
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OpError("`%s pull %s` failed: %s" % (engine, image, said[-1] if said else
                                                   "exit %d" % done.returncode),
                      "multihost run --image %s --image-from-controller" % image)
    return {"image_id": container.image_id(path, image)}


@op("image.load", stream=True)
def load(request):
    """stdin to ``engine load``; the last line of stdout is the reply, as for any op.
    With ``relay`` (a node of the sync's relay chain, remote/sync/relay.py) the stream
    comes from the controller (the head) or the host before this one, and goes on to
    the next host as it is read: the controller's uplink carries the image once. Then
    the reply is ``nodes``: this host's image id or error, and the hosts it could not
    pass the stream to, each with its cause (the controller sends to those itself)."""
    import json

    spec = request.get("relay")
    if not isinstance(spec, dict):
        reply = _load(request, sys.stdin.buffer, None)
    else:
        reply = _load_in_chain(request, spec)
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 0 if reply["ok"] else 1


def _load_in_chain(request, spec):
    from ..sync import relay

    rank = str(request.get("rank"))
    try:
        node = relay.Node(spec)
    except relay.RelayError as exc:
        return {"ok": False, "error": str(exc), "fix": "the controller sends this host the "
                                                      "image itself"}
    try:
        stream = node.stream(sys.stdin.buffer)
    except relay.RelayError as exc:
        return {"ok": True, "result": {"nodes": {rank: {"error": str(exc)}}}}
    try:
        own = _load(request, stream, node.downstream)
        nodes = {rank: own["result"] if own["ok"] else {"error": own["error"]}}
        done = getattr(stream, "done", None)
        if done is not None:
            done()   # the upstream's join may end: the whole stream is read
        nodes.update(node.downstream.finish())
    finally:
        node.close()
    return {"ok": True, "result": {"nodes": nodes}}


def _load(request, stream, downstream):
    """``engine load`` fed from ``stream`` (and every byte passed on to ``downstream``);
    a stream shorter or longer than the request's ``size`` is refused, not loaded."""
    import threading

    from ..sync.wire import StreamError

    try:
        engine, path = container.find_engine(request.get("engine") or None)
    except container.ContainerError as err:
        engine, path, failed = None, None, err.text
    else:
        failed = None
    proc, said = None, []
    if path:
        proc = subprocess.Popen([path, "load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        # Its output read as it comes: a full pipe would stop it reading the image.
        readers = [threading.Thread(target=lambda: proc.stdout.read()),
                   threading.Thread(target=lambda: said.append(proc.stderr.read()))]
        for reader in readers:
            reader.daemon = True
            reader.start()
    count = 0
    while True:
        try:
            chunk = stream.read(CHUNK)
        except StreamError as exc:
            failed = failed or str(exc)
            break
        if not chunk:
            break
        count += len(chunk)
        if downstream is not None:
            downstream.feed(chunk)
        if proc is not None and failed is None:
            try:
                proc.stdin.write(chunk)
            except OSError:
                failed = "`%s load` stopped reading" % engine   # still passed on
    if downstream is not None:
        downstream.end_input()   # the next hosts load while we do
    size = request.get("size")
    if failed is None and size is not None and count != size:
        failed = "the image's stream ended after %d of %d bytes" % (count, size)
    if proc is not None:
        if failed is not None:
            proc.kill()
        try:
            proc.stdin.close()
        except OSError:
            pass
        code = proc.wait()
        for reader in readers:
            reader.join(10)
        if code != 0 and failed is None:
            lines = b"".join(said).decode("utf-8", "replace").strip().splitlines()
            failed = "`%s load` failed: %s" % (engine, lines[-1] if lines else "exit %d" % code)
    if failed is not None:
        return {"ok": False, "error": failed, "fix": "see `%s load` on this host" % engine}
    image = request.get("image")
    return {"ok": True, "result": {
        "image_id": container.image_id(path, image) if image else None}}


@op("image.clean")
def clean(request):
    try:
        engine, path = container.find_engine(request.get("engine") or None)
    except container.ContainerError:
        return {"removed": []}
    return {"removed": container.remove_run_containers(path, request["run_id"])}
