"""A check is one registered record: registering it is all it takes for its probe to be
asked of every host and its column to appear, in its place, in what a user reads."""
import io

import pytest

from multihost.check import registry
from multihost.check.registry import check, checks, probes_for
from multihost.check.report import PASS, CheckResult
from multihost.hosts import Host
from multihost.job import JobOptions
from multihost.remote.check import ops as ops_check
from multihost.views.check_view import render_plain
from test_check_samples import lab_probes, report_of


def test_every_probe_a_check_reads_is_one_the_host_has():
    named = {p for c in checks() for p in c.probes + ((c.source,) if c.source else ())}
    assert named - set(ops_check.PROBES) == set()


def test_a_name_taken_by_another_check_is_refused():
    with pytest.raises(ValueError, match="two checks named 'disk'"):
        check("disk", order=1)(lambda probe, cluster: None)


@pytest.fixture
def scratch(monkeypatch):
    """The registry as it is, restored after the test."""
    monkeypatch.setattr(registry, "_CHECKS", dict(registry._CHECKS))


def test_one_record_adds_a_probe_and_a_column_in_its_place(scratch):
    @check("datasets", order=45, probes=("data",))
    def judge_datasets(probe, cluster):
        return CheckResult("datasets", PASS, f"{len(probe.fact('data') or {})} found", brief="ok")

    assert "data" in probes_for(JobOptions(), Host("a", rank=0))  # with no --data too
    text = io.StringIO()
    render_plain(report_of(lab_probes()), text)
    header = text.getvalue().splitlines()[0].split()
    assert header[header.index("SOFTWARE") + 1] == "DATASETS"


def test_a_probe_is_asked_only_of_the_jobs_that_want_it():
    host = Host("a", rank=0)
    assert "data" not in probes_for(JobOptions(), host)
    assert "data" in probes_for(JobOptions(data=("/data/coco",)), host)
