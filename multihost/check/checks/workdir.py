"""workdir: the job's directory is not one the system or the user already lives in, nor
one another account may change (remote/owners.py).

The sync writes the code's files into the workdir (over any file of the same name) and
the job its logs and checkpoints: a workdir of ``/etc``, ``/usr`` or the home directory
itself would scatter them among the system's or the user's own files (``.bashrc``,
``authorized_keys``). Judged on the host's own terms: the host reports its home and the
workdir with ``~``, ``..`` and symlinks resolved (remote/check/ops.disk_facts), so
``~``, ``/usr/../etc/`` and a link to ``/etc`` are all seen for what they are.

Shown only for the hosts where the workdir is such a directory.
"""
from __future__ import annotations

import dataclasses
import posixpath
import shlex
from typing import Optional

from .. import fixes
from ..judge import Survey, HostProbe
from ..registry import check
from ..report import FAIL, CheckResult
from ...job import in_place, workdir_for
from ...remote.owners import SYSTEM_DIRS


def clip(text: object, limit: int = 300) -> str:
    """A host's words, cut to a line's worth."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def what_it_is(real: str, home: Optional[str]) -> Optional[str]:
    """Why a resolved workdir is not a place for a job, or None when it is one."""
    if real in SYSTEM_DIRS:
        return "a system directory"
    if home and real == home:
        return "the home directory itself"
    if home and real == posixpath.join(home, ".ssh"):
        return "ssh's own directory (keys, authorized_keys)"
    if home and real.startswith(posixpath.join(home, ".ssh") + "/"):
        # a hostfile's workdir ~/.ssh holds the project's directory: ~/.ssh/<project>
        return "inside ssh's own directory (keys, authorized_keys)"
    return None


def what_it_is_as_typed(path: str) -> Optional[str]:
    """The same rule, judged from the workdir as written, before any host is asked (sync
    and run refuse it before they write anything): ``~`` and a relative path are in the
    host's home, ``..`` climbs out of it. A path only the host can resolve (a link, an
    absolute path into the home) is left to the check's own judgement."""
    if path.startswith("/"):
        return what_it_is("/" + posixpath.normpath(path).lstrip("/"), None)
    if path.startswith("~"):
        user, _, rest = path[1:].partition("/")
        if user:
            return None     # another user's home: only that host knows where it is
        path = rest
    rel = posixpath.normpath(path or ".")
    if rel == ".":
        return "the home directory itself"
    if rel == ".ssh" or rel.startswith(".ssh/"):
        return what_it_is("~/" + rel, "~")
    if all(part == ".." for part in rel.split("/")):
        return "a directory that holds the home directory"
    return None


def refuse_unsafe_workdirs(hosts, code: str) -> None:
    """A ConfigError for the first host whose workdir, as written, is a system directory,
    the home directory or above it, or ~/.ssh: what `check` refuses, refused by sync and
    run before anything is written."""
    from ...errors import ConfigError

    for host in hosts:
        if in_place(host, code):
            continue
        path = workdir_for(host, code)
        what = what_it_is_as_typed(path)
        if what is not None:
            default = workdir_for(dataclasses.replace(host, workdir=None), code)
            raise ConfigError(f"the workdir {path} is {what}: the sync would write the code's "
                              "files into it", host=host.label,
                              fix=f"give the job a directory of its own: --workdir "
                                  f"{shlex.quote(default)}")


@check("workdir", order=95, probes=("disk",), source=None, short="wdir")
def judge_workdir(probe: HostProbe, survey: Survey) -> Optional[CheckResult]:
    # Reads the disk probe's facts; when that probe could not answer, the disk check
    # (or ssh) already says why, once.
    disk = probe.fact("disk") or {}
    path, real = disk.get("path"), disk.get("real")
    if not real:
        return None
    here = in_place(probe.host, survey.job.code)
    if disk.get("unsafe"):
        # Another account could swap the code between the sync and the launch.
        return CheckResult(
            "workdir", FAIL, f"the workdir {path} is not only yours: {clip(disk['unsafe'])}",
            "use a directory only you can write: "
            + ("cd to one of your own" if here else fixes.add(
                "--workdir", shlex.quote(workdir_for(dataclasses.replace(probe.host, workdir=None),
                                                     survey.job.code)))),
            "not yours")
    if here:
        if real in SYSTEM_DIRS:
            return CheckResult("workdir", FAIL, f"the job would run in {real}, a system directory",
                               "run it from a directory of its own (cd there)", "system dir")
        return None   # the job runs in its own directory, as torchrun would: nothing is synced
    what = what_it_is(real, disk.get("home"))
    if what is None:
        return None
    typed = path in (None, real, real.rstrip("/") + "/")
    where = f"{real} is {what}" if typed else f"{path} resolves to {real}, {what}"
    default = workdir_for(dataclasses.replace(probe.host, workdir=None), survey.job.code)
    return CheckResult(
        "workdir", FAIL,
        f"the workdir {where}: the sync would write the code's files into it",
        # Quoted, so that `~` is this host's home, not the controller's; added last, it
        # beats an earlier --workdir and the hostfile's workdir =.
        "give the job a directory of its own: "
        + fixes.add("--workdir", shlex.quote(default)),
        "system dir" if what == "a system directory" else "home" if "home" in what else "~/.ssh")
