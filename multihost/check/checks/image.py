"""With ``--image``: every host's container engine and the image on it (one image
everywhere), and the containers earlier runs left there."""
from __future__ import annotations

from typing import Optional

from .. import fixes
from ..judge import Survey, HostProbe, not_checked
from ..registry import check
from ..report import FAIL, PASS, WARN, CheckResult

SHORT_ID = 19   # "sha256:" and 12 hex digits, as `podman images` shows an id
# The probe runs the engine three to five times (info, image inspect, ps; nvidia-smi and
# nvidia-ctk with GPUs): a tenth of a second each on a quiet host, seconds each on a busy
# one, where podman (a Go binary that opens its storage) waits for the cores.
IMAGE_BUDGET = 30.0


def _wanted(job, host) -> bool:
    return bool(job.image)


def short(image_id: Optional[str]) -> str:
    return (image_id or "")[:SHORT_ID]


def reference(survey: Survey):
    """(rank, id) every host's image is held to: the first host's that has it."""
    for probe in survey.probes:
        found = probe.fact("image") or {}
        if found.get("image_id"):
            return probe.host.rank, found["image_id"]
    return None, None


@check("image", order=45, probes=("image",), short="image", wanted=_wanted,
       budget=IMAGE_BUDGET)
def judge_image(probe: HostProbe, survey: Survey) -> Optional[CheckResult]:
    if not survey.job.image:
        return None   # no image, no column
    skipped = not_checked(probe, "image")
    if skipped:
        return skipped
    found = probe.fact("image") or {}
    image = survey.job.image
    if not found.get("engine"):
        argv = (found.get("fix") or "apt-get install -y podman").split()
        return CheckResult("image", FAIL, found.get("error") or "no container engine",
                           fixes.run(fixes.on_host(survey.given, probe.host, *argv)),
                           "no engine")
    engine = f"{found['engine']} {found.get('version') or '?'}"
    mode = "rootless" if found.get("rootless") else "rootful"
    gpus = f", GPUs by {found['gpu_runtime']}" if found.get("gpu_runtime") else ""
    left = [c for c in found.get("leftovers") or () if c.get("run")]
    if left:
        names = [c["name"] for c in left]
        first = left[0]
        mine = all(c.get("owner") == found.get("user") for c in left)
        detail = (f"container {first['name']} of run {first['run']} (owner "
                  f"{first.get('owner') or '?'}, {first.get('status')}) is left"
                  + (f", and {len(left) - 1} more" if len(left) > 1 else ""))
        fix = fixes.run(fixes.on_host(survey.given, probe.host, found["engine"], "rm", "-f",
                                      *names))
        if not mine:
            fix = f"ask {first.get('owner') or 'its owner'} to end it, or {fix}"
        return CheckResult("image", WARN, detail, fix, "leftover")
    rank, wanted = reference(survey)
    mine_id = found.get("image_id")
    if not mine_id:
        return CheckResult("image", PASS, f"{engine} ({mode}){gpus}; {image} not here yet: "
                           "the run pulls it, or sends it from this machine", f"{engine} pull")
    if mine_id != wanted and survey.job.image_from_controller:
        return CheckResult("image", PASS, f"{engine} ({mode}){gpus}; {image} {short(mine_id)} "
                           "here, replaced by this machine's at launch", f"{engine} send")
    if mine_id != wanted:
        return CheckResult("image", FAIL,
                           f"{image} here is {short(mine_id)}, {short(wanted)} on "
                           f"{survey.label(rank)}: the hosts would run different images",
                           fixes.add("--image-from-controller") + " (every host then gets "
                           "this machine's image)", "differs")
    return CheckResult("image", PASS, f"{engine} ({mode}){gpus}; {image} {short(mine_id)}",
                       brief=f"{engine} {short(mine_id)[7:]}")
