"""status --all's Slurm section: the cluster's jobs as squeue shows them, every user's."""
from __future__ import annotations

import io
import os

from multihost.slurm import jobs
from multihost.views.slurm_view import render_jobs

SQUEUE = ("12|alice|RUNNING|1:02:03|2|h[1-2]|train a|b\n"
          "13|bob|PENDING|0:00|2|(Resources)|multihost\n")


def test_every_job_is_read_with_its_nodes_or_its_reason_and_drawn_as_squeue_does():
    found = jobs.parse(SQUEUE)
    assert [(j.job_id, j.user, j.state, j.where, j.name) for j in found] == [
        ("12", "alice", "RUNNING", "h[1-2]", "train a|b"),
        ("13", "bob", "PENDING", "(Resources)", "multihost")]
    out = io.StringIO()
    render_jobs(found, out)
    lines = out.getvalue().splitlines()
    assert lines[1] == "Slurm jobs (squeue, every user): 2"
    assert lines[2].split() == ["JOBID", "USER", "STATE", "TIME", "NODES", "NODELIST(REASON)", "NAME"]
    assert lines[4].split() == ["13", "bob", "PENDING", "0:00", "2", "(Resources)", "multihost"]


def test_where_there_is_no_squeue_there_is_no_slurm_section(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    assert jobs.cluster_jobs() is None
    fake = tmp_path / "squeue"
    fake.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert jobs.cluster_jobs() is None          # there, but no controller answers
    fake.write_text("#!/bin/sh\nprintf '" + SQUEUE.replace("\n", "\\n") + "'\n")
    assert [j.job_id for j in jobs.cluster_jobs()] == ["12", "13"]
    assert os.environ["PATH"] == str(tmp_path)


def test_slurms_clients_without_a_cluster_are_not_asked(tmp_path, monkeypatch):
    # squeue would then look for a controller in DNS: nothing is run at all.
    monkeypatch.setenv("PATH", str(tmp_path))
    for name in ("SLURM_CONF", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(jobs, "CONFIGS", (str(tmp_path / "none.conf"),))
    fake = tmp_path / "squeue"
    fake.write_text(f"#!/bin/sh\ntouch {tmp_path / 'asked'}\necho '1|a|RUNNING|0:01|1|h1|x'\n")
    fake.chmod(0o755)
    assert jobs.cluster_jobs() is None and not (tmp_path / "asked").exists()
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    assert [j.job_id for j in jobs.cluster_jobs()] == ["1"]
