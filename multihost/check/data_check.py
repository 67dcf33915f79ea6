"""The "data" check: ``multihost.data.verify.verify_data`` (every host hashes its copy of each
--data path through its own cache and compares with the first host), run alongside the
facts and turned into one result per host.
"""
from __future__ import annotations

import threading
from typing import Dict, Optional, Sequence

from .fixes import multihost, run
from .report import FAIL, PASS, CheckResult
from ..errors import MultihostError
from ..fanout import HostGroup
from ..hosts import Host
from ..job import JobOptions


class DataVerification:
    """The dataset comparison of ``multihost.data.verify`` (every host hashes its copy, through
    its own cache), run alongside the facts; without it, the "data" check only says
    whether each path exists."""

    def __init__(self, cluster: HostGroup, job: JobOptions, workdirs: Dict[int, str],
                 given: str = ""):
        self.cluster = cluster
        self.given = given
        self.paths = tuple(dict.fromkeys(tuple(job.data) + tuple(
            p for host in cluster.hosts for p in host.data)))
        self.workdirs = workdirs
        self._thread: Optional[threading.Thread] = None
        self._outcome: object = None
        self._verify = None
        if self.paths:
            from ..data import verify_data

            self._verify = verify_data

    def start(self) -> None:
        if self._verify is None or self._thread is not None:
            return

        def work() -> None:
            try:
                self._outcome = self._verify(self.cluster, self.paths, workdirs=self.workdirs)
            except MultihostError as err:
                self._outcome = err

        self._thread = threading.Thread(target=work, daemon=True)
        self._thread.start()

    def results(self, timeout: float) -> Dict[int, CheckResult]:
        if self._thread is None:
            return {}
        self._thread.join(timeout)
        if self._thread.is_alive():
            return {h.rank: CheckResult("data", FAIL, f"hashing the data took longer than "
                                                      f"{timeout:.0f}s", "check again (the "
                                                      "same command): the hash cache makes "
                                                      "the next one faster", "timeout")
                    for h in self.cluster.hosts}
        return data_results(self._outcome, self.cluster.hosts, self.paths, self.given)


def sync_data_fix(paths: Sequence[str], given: str) -> str:
    """The command that makes every host's copy the first host's, for these hosts (only
    the data: the code is the run's business)."""
    words = [w for p in paths for w in ("--data", p)]
    return run(multihost("sync", given, *words, "--sync-data", "--no-code"))


def data_results(outcome: object, hosts: Sequence[Host], paths: Sequence[str] = (),
                 given: str = "") -> Dict[int, CheckResult]:
    """``data.verify_data``'s DataReport (or a MultihostError) as one result per host;
    ``given``: the hosts as the user named them, for the repair's command."""
    if outcome is None:
        return {}
    if isinstance(outcome, MultihostError):
        named = [h for h in hosts if outcome.host in (h.label, h.name)]
        return {h.rank: CheckResult("data", FAIL, outcome.cause, outcome.fix, "failed")
                for h in (named or hosts)}
    from ..data import describe

    repair = "copy it from the first host, host to host: " + sync_data_fix(paths, given)
    odd = set(getattr(outcome, "odd_first", ()) or ())
    results: Dict[int, CheckResult] = {}
    for item in getattr(outcome, "hosts", ()):
        if item.error:
            results[item.rank] = CheckResult("data", FAIL, item.error, item.fix, "unreadable")
            continue
        differs = [d for d in item.diffs if not d.empty]
        if differs:
            fix = (f"the first host's copy of {differs[0].path} differs from all the others, "
                   "which agree: repair it there, or list a good host first"
                   if differs[0].path in odd else repair)
            what = "; ".join(describe(d) for d in differs)
            absent = all(d.absent for d in differs)
            detail = what if absent else f"differs from the first host: {what}"
            results[item.rank] = CheckResult("data", FAIL, detail, fix,
                                             "missing" if absent else "differs")
            continue
        files = sum(state.files for state in item.states)
        size = sum(state.bytes for state in item.states)
        results[item.rank] = CheckResult(
            "data", PASS, f"{', '.join(paths)}: {files} files, {size / 2 ** 30:.1f} GiB, "
                          "identical to the first host", brief="identical")
    return results
