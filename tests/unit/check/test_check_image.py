"""check --image (check/checks/image.py): a row per host from its engine's facts."""
import dataclasses

from multihost.check.checks.image import IMAGE_BUDGET, judge_image
from multihost.check.judge import judge, make_survey
from multihost.check.registry import budgets_for, probes_for
from multihost.hosts import Host
from multihost.job import JobOptions

from test_check_samples import ADDRESSES, lab_probes, with_facts

IMAGE = "localhost/train:1"
GOOD = "sha256:" + "6b38d8acda15" + "0" * 52
OTHER = "sha256:" + "da5a3a961267" + "0" * 52


def engine(image_id=GOOD, **more):
    facts = {"engine": "podman", "version": "4.3.1", "rootless": False, "user": "root",
             "gpu_runtime": "", "gpus": 0, "image_id": image_id, "leftovers": []}
    facts.update(more)
    return facts


def judged(*facts, **job):
    probes = [with_facts(p, image=f) for p, f in zip(lab_probes(len(facts)), facts)]
    cluster = make_survey(probes, JobOptions(image=IMAGE, **job), 17000, ADDRESSES[0], False)
    cluster = dataclasses.replace(cluster, given="--ips " + ",".join(ADDRESSES[:2]))
    return [judge_image(p, cluster) for p in cluster.probes]


def test_a_row_per_host_says_engine_mode_and_image_id():
    rows = judged(engine(), engine())
    assert [r.status for r in rows] == ["pass", "pass"]
    assert rows[1].detail == f"podman 4.3.1 (rootful); {IMAGE} sha256:6b38d8acda15"


def test_an_image_that_differs_fails_with_the_image_from_the_controller():
    rows = judged(engine(), engine(OTHER))
    assert rows[1].status == "fail"
    assert "sha256:da5a3a961267, sha256:6b38d8acda15 on 198.18.0.11" in rows[1].detail
    assert rows[1].fix.startswith("add `--image-from-controller`")
    assert judged(engine(), engine(OTHER), image_from_controller=True)[1].status == "pass"


def test_a_host_without_the_engine_gets_the_install_line_for_that_host():
    rows = judged(engine(), {"engine": None, "error": "podman is not installed on this host",
                             "fix": "sudo apt-get install -y podman catatonit"})
    assert rows[1].status == "fail"
    assert rows[1].fix == ("run `multihost exec --ips 198.18.0.11,198.18.0.12 --include "
                           "198.18.0.12 -- sudo apt-get install -y podman catatonit`")


def test_a_host_without_the_image_passes_it_is_pulled_or_sent():
    rows = judged(engine(), engine(None))
    assert rows[1].status == "pass" and "not here yet" in rows[1].detail


def test_a_container_left_by_another_users_run_names_its_owner():
    left = [{"id": "abc", "name": "mh-R-n0", "run": "R", "owner": "bob", "status": "Up 2 hours"}]
    row = judged(engine(leftovers=left), engine())[0]
    assert row.status == "warn"
    assert row.detail == "container mh-R-n0 of run R (owner bob, Up 2 hours) is left"
    assert row.fix.startswith("ask bob to end it, or run `multihost exec")
    assert row.fix.endswith("-- podman rm -f mh-R-n0`")


def test_no_image_no_column():
    probes = lab_probes(2)
    cluster = make_survey(probes, JobOptions(), 17000, ADDRESSES[0], False)
    assert [judge_image(p, cluster) for p in cluster.probes] == [None, None]


def test_the_engine_probe_gets_its_own_budget_and_its_timeout_names_it():
    """podman takes seconds a command on a busy host: the image probe is not held to the
    8 s of the quick probes, and a timeout names the seconds it was really given."""
    host = Host("198.18.0.11")
    asked = probes_for(JobOptions(image=IMAGE), host)
    assert budgets_for(asked, 8.0) == {"image": IMAGE_BUDGET} and IMAGE_BUDGET > 8.0
    assert budgets_for(probes_for(JobOptions(), host), 8.0) == {}   # no image: as before
    assert budgets_for(asked, IMAGE_BUDGET + 10) == {}   # a --timeout above it: for all
    late = {"timed_out": ["image", "disk"], "errors": {}}
    probes = [dataclasses.replace(with_facts(p, **late), budgets=budgets_for(asked, 8.0))
              for p in lab_probes(2)]
    cluster = make_survey(probes, JobOptions(image=IMAGE), 17000, ADDRESSES[0], False)
    row = judge_image(cluster.probes[1], cluster)
    assert row.status == "fail" and row.detail == f"did not finish within {IMAGE_BUDGET:g}s"
    disk = [r for r in judge(cluster)[1].results if r.name == "disk"][0]
    assert "8s" in disk.detail and f"{IMAGE_BUDGET:g}s" not in disk.detail
