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
    """stdin to ``engine load``; the last line of stdout is the reply, as for any op."""
    import json

    engine, path = container.find_engine(request.get("engine") or None)
    done = subprocess.run([path, "load"], stdin=sys.stdin.buffer, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        reply = {"ok": False, "error": "`%s load` failed: %s" % (engine, said[-1] if said else
                                                                 "exit %d" % done.returncode),
                 "fix": "see `%s load` on this host" % engine}
    else:
        image = request.get("image")
        reply = {"ok": True, "result": {
            "image_id": container.image_id(path, image) if image else None}}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 0 if reply["ok"] else 1


@op("image.clean")
def clean(request):
    try:
        engine, path = container.find_engine(request.get("engine") or None)
    except container.ContainerError:
        return {"removed": []}
    return {"removed": container.remove_run_containers(path, request["run_id"])}
