"""What the steps of a run before its launch do on the hosts: the preflight (and the
spares' own check beside it), the code sync (and data verification) and the setup step.
``lifecycle.py`` runs them, on the job's hosts, and again on a spare that takes a rank.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Optional, Sequence, Tuple

from ..errors import CheckError
from ..hosts import Host
from ..job import JobOptions, in_place, workdir_for

Notify = Callable[[str], None]
# Checks between hosts: among the spares alone they test peers the spare will never have
# (the check that runs again once a spare takes a rank tests its real ones).
BETWEEN_HOSTS = ("rendezvous", "ping")


def _quiet(text: str) -> None:
    pass


def preflight(cluster, job: JobOptions, *, allow_concurrent: bool = False,
              notify: Notify = _quiet):
    """The checks of `multihost check`; a failure stops here, before anything starts.
    Every failure but the first is told through ``notify``; the first is raised."""
    from ..check.preflight import run_checks
    from ..check.report import FAIL, WARN

    notify(f"checking {len(cluster.hosts)} host(s)...")
    report = run_checks(cluster, job)
    for host, result in report.failures(WARN):
        if result.name == "busy":   # the host's registry is not used: runs there may be hidden
            notify(f"{host.host.label}: warning: {result.detail} (fix: {result.fix})")
    failures = [(h, r) for h, r in report.failures(FAIL)
                if not (allow_concurrent and r.name in ("leftovers", "busy"))]
    for host, result in failures[1:]:
        fix = f" (fix: {result.fix})" if result.fix else ""
        notify(f"{host.host.label}: {result.name}: {result.detail}{fix}")
    if failures:
        from ..check.report import named_failures
        from ..errors import and_more

        host, result = failures[0]
        raise CheckError(f"{result.name}: {result.detail}"
                         f"{and_more(named_failures(failures[1:]), count=len(failures) - 1)}",
                         host=host.host.label, fix=result.fix)
    if report.start_port is None:
        raise report.error()
    return report


def in_place_if_shared(cluster, job: JobOptions, notify: Notify = _quiet):
    """(the hosts, whether they run in place): each host with the code directory itself
    as its workdir when that directory is the same one at the same path on every host (a
    project on NFS): nothing is copied, every rank runs in it and its outputs land there.
    Only for hosts left at the default workdir (a workdir given is where the user wants
    the code)."""
    import dataclasses

    from ..hosts import IN_PLACE
    from ..sync.shared import code_everywhere
    from ..transport import is_local_host

    # This machine alone sees its own directories, shared or not: it keeps the workdir.
    if any(host.workdir for host in cluster.hosts) or all(
            is_local_host(host) for host in cluster.hosts):
        return cluster, False
    if not code_everywhere(cluster, job.code):
        return cluster, False
    n = len(cluster.hosts)
    notify(f"code: {os.path.abspath(job.code)} is the same directory on "
           f"{'all ' + str(n) + ' hosts' if n > 1 else 'the host'}: no copy")
    return cluster.subset([dataclasses.replace(host, workdir=IN_PLACE)
                           for host in cluster.hosts]), True


def sync_for_run(cluster, job: JobOptions, *, code: bool, data_checked: bool,
                 notify: Notify = _quiet, view=None) -> None:
    """The code synced to every host's workdir (unless ``code`` is false, or the job runs
    in the code directory itself: this machine with no hosts given), and the datasets
    verified when the preflight did not already. ``view``, when given, is a sync view:
    it listens to the sync's progress and is shown its report."""
    paths = tuple(dict.fromkeys(tuple(job.data) + tuple(p for h in cluster.hosts for p in h.data)))
    code = code and not all(in_place(host, job.code) for host in cluster.hosts)
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
          notify: Notify = _quiet, digest: Optional[Callable[[], str]] = None) -> str:
    """The setup step on every host (skipped where unchanged); the code tree's content
    hash, which keys it and is recorded for `rerun --same-code` (``digest``: its
    ``digest_in_background``, else hashed here)."""
    from . import setup_step

    digest = digest() if digest is not None else setup_step.code_digest(job.code)
    if not command:
        return digest
    notify(f"setup on {len(cluster.hosts)} host(s): {command}")
    workdirs = {host.rank: workdir_for(host, job.code) for host in cluster.hosts}
    setup_step.run_setup(cluster, command, digest, workdirs, always=always,
                         on_result=lambda result: setup_step.show(result, notify))
    return digest


def digest_in_background(code_dir: str) -> Callable[[], str]:
    """The code tree's content hash (``setup_step.code_digest``) taken in a thread while
    the preflight waits on the hosts; call the result to wait for it (its error, if it
    failed, is raised there)."""
    from . import setup_step

    box: dict = {}

    def work() -> None:
        try:
            box["digest"] = setup_step.code_digest(code_dir)
        except BaseException as exc:  # raised to the caller, where it waits for the hash
            box["error"] = exc

    thread = threading.Thread(target=work, daemon=True)
    thread.start()

    def result() -> str:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["digest"]
    return result


def check_spares(cluster, spares: Sequence[Host], job: JobOptions,
                 notify: Notify) -> Tuple[str, ...]:
    """The spares' own preflight: the label of every spare that fails it, each told
    through ``notify`` as a warning line (a dead spare is never "not ready": the job's
    hosts are judged apart)."""
    if not spares:
        return ()
    from ..check.preflight import run_checks
    from ..check.report import FAIL
    from ..fanout import HostGroup

    with HostGroup(spares, cluster.options, workers=cluster.workers) as own:
        report = run_checks(own, job)
    bad = []
    for host_report in report.hosts:
        failures = [r for r in host_report.results
                    if r.status == FAIL and r.name not in BETWEEN_HOSTS]
        if failures:
            first = failures[0]
            fix = f" (fix: {first.fix})" if first.fix else ""
            notify(f"warning: spare {host_report.host.label} is not usable: "
                   f"{first.name}: {first.detail}{fix}")
            bad.append(host_report.host.label)
    return tuple(bad)


def checked_in_background(cluster, spares: Sequence[Host], job: JobOptions,
                          notify: Notify) -> Callable[[], Tuple[str, ...]]:
    """``check_spares`` beside the job's own preflight; call the result to wait for it."""
    if not spares:   # no thread for nothing to check (every run without spares)
        return lambda: ()
    box = {"bad": ()}

    def work() -> None:
        try:
            box["bad"] = check_spares(cluster, spares, job, notify)
        except Exception as exc:  # a spare's check never stops the job's
            notify(f"warning: the spares could not be checked: {exc}")

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return lambda: (thread.join(), box["bad"])[1]
