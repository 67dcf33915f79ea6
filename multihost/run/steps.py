"""The steps of a run that touch every host before anything starts: the preflight, the
code sync (and data verification) and the setup step. The pipeline runs them on the job's
hosts; a spare that takes a rank runs the last two on its own (``run/replace.py``).
"""
from __future__ import annotations

import os
from typing import Callable, Optional

from ..errors import CheckError
from ..job import JobOptions, workdir_for

Notify = Callable[[str], None]


def _quiet(text: str) -> None:
    pass


def preflight(cluster, job: JobOptions, *, allow_concurrent: bool = False,
              notify: Notify = _quiet):
    """The checks of `multihost check`; a failure stops here, before anything starts.
    Every failure but the first is told through ``notify``; the first is raised."""
    from ..check.preflight import run_checks
    from ..check.report import FAIL

    notify(f"checking {len(cluster.hosts)} host(s)...")
    report = run_checks(cluster, job)
    failures = [(h, r) for h, r in report.failures(FAIL)
                if not (allow_concurrent and r.name == "leftovers")]
    for host, result in failures[1:]:
        fix = f" (fix: {result.fix})" if result.fix else ""
        notify(f"{host.host.label}: {result.name}: {result.detail}{fix}")
    if failures:
        host, result = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise CheckError(f"{result.name}: {result.detail}{more}", host=host.host.label,
                         fix=result.fix)
    if report.start_port is None:
        raise report.error()
    return report


def sync_for_run(cluster, job: JobOptions, *, code: bool, data_checked: bool,
                 notify: Notify = _quiet, view=None) -> None:
    """The code synced to every host's workdir (unless ``code`` is false), and the
    datasets verified when the preflight did not already. ``view``, when given, is a
    sync view: it listens to the sync's progress and is shown its report."""
    paths = tuple(dict.fromkeys(tuple(job.data) + tuple(p for h in cluster.hosts for p in h.data)))
    if not code and (data_checked or not paths):
        return  # nothing to do: do not even import the sync engine
    from ..sync.pipeline import sync_code

    workdirs = {host.rank: workdir_for(host, job.code) for host in cluster.hosts}
    if code:
        notify(f"syncing {os.path.abspath(job.code)} to {len(cluster.hosts)} host(s)...")
        report = sync_code(cluster, job.code, workdirs=workdirs, listener=view)
        if view is not None:
            view.show_sync(report)
    if paths and not data_checked:  # the preflight verifies the data itself
        notify(f"verifying {len(paths)} dataset(s) on {len(cluster.hosts)} host(s)...")
        from ..data.verify import data_error, verify_data

        report = verify_data(cluster, paths, workdirs=workdirs)
        if not report.ok:
            raise data_error(report)


def setup(cluster, job: JobOptions, command: Optional[str], *, always: bool = False,
          notify: Notify = _quiet) -> str:
    """The setup step on every host (skipped where unchanged); the code tree's content
    hash, which keys it and is recorded for `rerun --same-code`."""
    from . import setup_step

    digest = setup_step.code_digest(job.code)
    if not command:
        return digest
    notify(f"setup on {len(cluster.hosts)} host(s): {command}")
    workdirs = {host.rank: workdir_for(host, job.code) for host in cluster.hosts}
    setup_step.run_setup(cluster, command, digest, workdirs, always=always,
                         on_result=lambda result: setup_step.show(result, notify))
    return digest
