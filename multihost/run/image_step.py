"""The image step of ``run --image``: after the sync and setup, before the launch, every
host has the image, and the same one.

Each host is asked what it has (``image.facts``). A host without it pulls it, all at
once; with ``--image-from-controller``, or where a pull fails and this machine has the
image, this machine's ``engine save`` is streamed to the hosts' ``engine load`` (saved
once, sent once: through the sync's relay chain, each host passing it on to the next). Then every host's image id (the digest of the image's
config, the same after a pull or a load) must be one: the controller's where it has the
image, else node 0's. The launch asks each host again (remote/run/inimage.py), so a
host whose image changed in between refuses to start rather than run something else.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Callable, Dict, Optional

from .. import helper
from ..errors import ConfigError, LaunchError, MultihostError
from ..fanout import HostGroup

CHUNK = 1 << 20
LOAD_TIMEOUT = 3600.0
Notify = Callable[[str], None]


def local_engine(wanted: Optional[str]) -> Optional[str]:
    for name in ((wanted,) if wanted else ("podman", "docker")):
        path = shutil.which(name)
        if path:
            return path
    return None


def local_image_id(engine: Optional[str], image: str) -> Optional[str]:
    """The image's id on this machine, or None (no engine, or no such image)."""
    if not engine:
        return None
    done = subprocess.run([engine, "image", "inspect", "--format", "{{.Id}}", image],
                          capture_output=True, text=True)
    value = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() \
        else ""
    if not value:
        return None
    return value if value.startswith("sha256:") else "sha256:" + value


def host_facts(cluster: HostGroup, image: str, engine: Optional[str]) -> Dict[int, dict]:
    """{rank: image.facts} of every host; an unreachable host is its own error."""
    def one(host, transport):
        facts = helper.call(transport, "image.facts", {"image": image, "engine": engine})
        facts["login"] = helper.login_hint(transport)
        return facts

    results = cluster.map(one)
    for result in results:
        if not result.ok:
            raise result.error
    return {r.host.rank: r.value for r in results}


def no_engine_error(host, facts) -> LaunchError:
    return LaunchError(f"{facts.get('error')}", host=host.label,
                       fix=f"{facts['login']} {facts.get('fix')}")


def ensure_image(cluster: HostGroup, image: str, engine: Optional[str], *,
                 from_controller: bool = False, notify: Notify = lambda text: None) -> str:
    """The image on every host; the one id it has everywhere."""
    facts = host_facts(cluster, image, engine)
    by_rank = {h.rank: h for h in cluster.hosts}
    for rank, found in sorted(facts.items()):
        if not found.get("engine"):
            raise no_engine_error(by_rank[rank], found)
    mine = local_engine(engine)
    wanted = local_image_id(mine, image)
    if from_controller and wanted is None:
        raise ConfigError(f"--image-from-controller: this machine has no image {image}",
                          fix=f"{'podman' if not mine else os.path.basename(mine)} pull "
                              f"{image} here first, or drop --image-from-controller")
    ids = {rank: found.get("image_id") for rank, found in facts.items()}
    send = [r for r, i in ids.items() if i is None or (from_controller and i != wanted)]
    if send and not from_controller:
        notify(f"pulling {image} on {len(send)} host(s)...")
        pulled, failed = pull(cluster, image, engine, send)
        ids.update(pulled)
        if failed and wanted is None:
            raise failed[min(failed)]
        send = sorted(failed)
    if send:
        notify(f"sending {image} from this machine to {len(send)} host(s)...")
        ids.update(stream_image(cluster, image, engine, mine, send, notify))
    reference = wanted or ids[min(ids)]
    for rank, value in sorted(ids.items()):
        if value != reference:
            raise LaunchError(f"image {image} is {(value or 'missing')[:19]} here, not "
                              f"{reference[:19]} as on {'this machine' if wanted else 'node 0'}",
                              host=by_rank[rank].label,
                              fix=f"multihost run --image {image} --image-from-controller ...")
    return reference


def pull(cluster: HostGroup, image: str, engine: Optional[str], ranks):
    """({rank: id} pulled, {rank: error} that failed): every host in ``ranks`` at once."""
    def one(host, transport):
        if host.rank not in ranks:
            return None
        return helper.call(transport, "image.pull", {"image": image, "engine": engine},
                           timeout=None)["image_id"]

    pulled, failed = {}, {}
    for result in cluster.map(one):
        if result.host.rank not in ranks:
            continue
        if result.ok:
            pulled[result.host.rank] = result.value
        else:
            failed[result.host.rank] = result.error
    return pulled, failed


def stream_image(cluster: HostGroup, image: str, engine: Optional[str], mine: Optional[str],
                 ranks, notify: Notify = lambda text: None) -> Dict[int, str]:
    """``engine save`` here once, then ``engine load`` on every host in ``ranks`` at once:
    through the sync's relay chain (each host passes the stream on to the next as it
    loads it, so the uplink carries one copy), and straight from here to a host the
    chain could not reach."""
    with tempfile.TemporaryDirectory(prefix="multihost-image-") as tmp:
        archive = os.path.join(tmp, "image.tar")
        done = subprocess.run([mine, "save", "-o", archive, image], capture_output=True, text=True)
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise ConfigError(f"`{os.path.basename(mine)} save {image}` failed here: {said}",
                              fix=f"{os.path.basename(mine)} image inspect {image}")
        request = {"image": image, "engine": engine, "size": os.path.getsize(archive)}
        loaded, missed = {}, {}
        if len(ranks) > 1:
            loaded, missed = relay_image(cluster, archive, request, sorted(ranks))
            if missed:
                first = missed[min(missed)]
                notify(f"{len(missed)} host(s) not reached through the relay ({first}): "
                       "sending to each from this machine...")
        direct = [r for r in ranks if r not in loaded]

        def one(host, transport):
            if host.rank not in direct:
                return None
            return load_on(transport, archive, request).get("image_id")

        results = cluster.map(one) if direct else []
    for result in results:
        if result.host.rank not in direct:
            continue
        if not result.ok:
            raise result.error
        loaded[result.host.rank] = result.value
    return loaded


def relay_image(cluster: HostGroup, archive: str, request: dict, ranks):
    """({rank: id} loaded, {rank: cause} not) through a relay chain of ``ranks``, the
    first the head: this machine streams the archive to it alone."""
    from ..sync.relay import Chain, head_failure
    from ..sync.transfer import hop_spec

    by_rank = {h.rank: h for h in cluster.hosts}
    hosts = [by_rank[r] for r in ranks]
    transports = [cluster.transport(h) for h in hosts]
    hops = [hop_spec(h, t, "", op="sync.join") for h, t in zip(hosts, transports)]
    chain = Chain(transports, [h.label for h in hosts], ranks, hops, {r: "" for r in ranks},
                  lambda process: None, keys=False, op="image.load")
    for node_request in chain.requests:
        node_request.update(request)

    def head(node_request):
        try:
            nodes = load_on(transports[0], archive, node_request).get("nodes")
        except MultihostError as err:
            return head_failure(ranks, hosts[0].label, err.cause)
        return nodes if isinstance(nodes, dict) else {}

    loaded, missed = {}, {}
    for key, node in chain.run(head).items():
        if node.get("image_id"):
            loaded[int(key)] = node["image_id"]
        else:
            missed[int(key)] = node.get("error") or "no answer"
    return loaded, missed


def load_on(transport, archive: str, request: dict) -> dict:
    """The archive as ``image.load``'s stream; its reply."""
    process = helper.start(transport, "image.load", request)
    try:
        with open(archive, "rb") as source:
            while True:
                chunk = source.read(CHUNK)
                if not chunk:
                    break
                process.stdin.write(chunk)
        process.stdin.close()
        out = process.stdout.read()
        code = process.wait(timeout=LOAD_TIMEOUT)
        reply = helper.parse_reply(transport, "image.load", code, out, process.read_stderr())
    finally:
        process.close()
    return reply or {}
