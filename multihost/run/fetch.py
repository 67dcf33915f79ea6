"""Bring a run's outputs back to the controller: ``multihost fetch [RUN] PATH... [--to DIR]``.

Checkpoints and results end in each host's workdir; this is the way back, as SkyPilot's
``sky rsync-down`` and ClusterShell's ``clush --rcopy`` have it. It is the system's
``rsync`` over the system's ``ssh`` (the same user, port, key and host-key policy as
``multihost ssh``), or over ``srun`` for a run whose nodes are steps of a Slurm job (no
sshd needed): rsync already copies by content, resumes a partial file and shows
progress, which nothing written here would do better.

What a host sends is not trusted: links that point out of the fetched tree are dropped
(``--safe-links``), owners and modes are not taken from the host, and a PATH must stay
inside the run's workdir: before the copy the host resolves it (``inspect_command``), and
a PATH that is a link out of the workdir, or lies below one, is refused naming where it
leads; so is one bigger than the bound (``--limit``, by apparent size: a sparse file
arrives whole). No value reaches rsync as an option: its paths come after ``--``, each
an absolute path or ``host:path``.
"""
from __future__ import annotations

import os
import posixpath
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from ..copy import PARALLEL, RSYNC, remote_arg, rsync_failure, run_rsync
from ..errors import ConfigError
from ..transport import is_local_host
from ..transport.srun import SrunOptions, remote_shell, step_error
from ..untrusted import clean_text
from .control import ssh_options
from .jobfile import last_run_from
from .records import NodeRecord, RunRecord, host_from_dict, load_run

DEFAULT_LIMIT = 100 << 30   # bytes: more than a few checkpoints, less than a full disk


@dataclass(frozen=True)
class Fetched:
    """One PATH from one host: where it landed, or why not (one line, with the fix)."""
    host: str
    path: str
    dest: str
    error: str = ""
    fix: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def fetch(paths: Sequence[str], *, run: Optional[str] = None, to: str = ".",
          every_host: bool = False, progress: bool = False,
          limit: int = DEFAULT_LIMIT) -> List[Fetched]:
    """Copy each PATH (relative to the run's workdir) from rank 0's host into ``to``, or
    with ``every_host`` from every host into ``to/<host>/``. Already there and unchanged:
    skipped; cut half way: resumed. ``progress`` lets rsync draw its progress line;
    ``limit``: the most bytes one PATH may hold. No ``run``: the last run of the code
    directory we are in, else the last run."""
    record = load_run(run if run is not None else last_run_from(os.getcwd()))
    to = os.path.abspath(os.path.expanduser(to))   # never an option, whatever it reads
    wanted = [checked_path(path) for path in paths]
    nodes = list(record.nodes) if every_host else [record.nodes[0]]
    jobs = [(node, path) for node in nodes for path in wanted]
    show = progress and len(jobs) == 1
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(jobs))) as pool:
        return list(pool.map(lambda job: _fetch_one(record, job[0], job[1], to, every_host,
                                                    show, limit), jobs))


def checked_path(path: str) -> str:
    """PATH as rsync gets it: relative, normalised, never above the workdir."""
    clean = posixpath.normpath(path.strip())
    if not path.strip() or path.startswith(("/", "~")) or clean == ".." or \
            clean.startswith("../"):
        raise ConfigError(f"{path!r} is not a path inside the run's workdir",
                          fix="name a path relative to the workdir, e.g. `multihost fetch "
                              "output/model.pdparams`")
    return clean


def _fetch_one(record: RunRecord, node: NodeRecord, path: str, to: str, every_host: bool,
               progress: bool, limit: int = DEFAULT_LIMIT) -> Fetched:
    base = Path(to) / node.label.replace("/", "_") if every_host else Path(to)
    dest = base / path
    refused = refused_path(record, node, path, limit)
    if refused is not None:
        return Fetched(node.label, path, str(dest), *refused)
    try:
        (dest if path == "." else dest.parent).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return Fetched(node.label, path, str(dest), f"cannot make {dest.parent}: {exc.strerror}",
                       "give a directory you can write with --to")
    into = dest if path == "." else dest.parent     # "." is the whole workdir
    code, said = run_rsync(_rsync_argv(record, node, path, str(into) + "/", progress),
                           progress=progress)
    if code == 0:
        return Fetched(node.label, path, str(dest))
    job = str((record.ssh or {}).get("job_id") or "")
    unreached = step_error(said.encode(), node.label, job) if job and code != -1 else None
    if unreached is not None:   # srun started no step: its job has ended, or is not there
        remote = posixpath.join(node.workdir or "~", path)
        return Fetched(node.label, path, str(dest), unreached.cause,
                       f"the run's Slurm job is needed to reach {node.label} by srun; where "
                       f"ssh is allowed: `rsync -rlt {node.host.get('name')}:{remote} "
                       f"{into}/`" if unreached.kind == unreached.LOST else unreached.fix)
    return _failure(node, path, str(dest), code, said, record.run_id)


def _rsync_argv(record: RunRecord, node: NodeRecord, path: str, into: str,
                progress: bool) -> List[str]:
    host = host_from_dict(node.host)
    argv = RSYNC + (["--info=progress2"] if progress else [])
    workdir = node.workdir or "."
    if is_local_host(host):
        return argv + ["--", os.path.abspath(os.path.join(os.path.expanduser(workdir), path)),
                       into]
    remote = posixpath.join(_remote_workdir(workdir), path)
    rsh = remote_shell(host, ssh_options(record))
    return argv + ["-e", shlex.join(rsh), "--", remote_arg(host, remote), into]


def _remote_workdir(workdir: str) -> str:
    """rsync's and ssh's remote paths start in the login's home: "~/x" is "x" there."""
    if workdir in ("~", "~/"):
        return "."
    return workdir[2:] if workdir.startswith("~/") else workdir


def inspect_command(workdir: str, path: str) -> str:
    """Run on the host: where PATH really is and how big. One line: ``IN <bytes>``,
    ``OUT <where it leads>``, or ``MISSING`` (rsync then says what is missing)."""
    return (f"cd -P -- {shlex.quote(workdir)} || exit 3; w=$PWD; "
            f"r=$(realpath -e -- {shlex.quote(path)} 2>/dev/null) || {{ echo MISSING; exit 0; }}; "
            'case "$r/" in "$w/"*) printf "IN %s\n" "$(du -s -B1 --apparent-size -- "$r" '
            '| cut -f1)";; *) printf "OUT %s\n" "$r";; esac')


def refused_path(record: RunRecord, node: NodeRecord, path: str, limit: int):
    """(error, fix) when PATH leads out of the workdir or is over ``limit``; None when it
    may be copied (or could not be looked at: rsync then says why)."""
    host = host_from_dict(node.host)
    workdir = node.workdir or "."
    if is_local_host(host):
        argv = ["sh", "-c", inspect_command(os.path.expanduser(workdir), path)]
    else:
        options = ssh_options(record)
        command = inspect_command(_remote_workdir(workdir), path)
        # ssh hands the remote shell one line; a Slurm step runs a program and its args.
        words = ["sh", "-c", command] if isinstance(options, SrunOptions) else [command]
        argv = remote_shell(host, options) + [host.name] + words
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    word, _, rest = done.stdout.decode("utf-8", "replace").strip().partition(" ")
    if word == "OUT":
        where = clean_text(rest)[:300]
        return (f"{path} leads out of the run's workdir {node.workdir or '~'} (to {where}): "
                "not fetched", f"copy it yourself if you trust it: `rsync -rlt "
                f"{host.name}:{shlex.quote(where)} .`")
    if word == "IN" and rest.isascii() and rest.isdigit() and int(rest) > limit:
        return (f"{path} holds {_size(int(rest))} on {node.label}, over the fetch bound of "
                f"{_size(limit)}", f"raise it: `multihost fetch {path} --limit "
                f"{_size(int(rest) * 2, unit=True)}`")
    return None


def _size(count: int, unit: bool = False) -> str:
    for name, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if count >= 1 << shift:
            value = count / (1 << shift)
            return f"{int(-(-value // 1))}{name}" if unit else f"{value:.1f} {name}iB"
    return f"{count}" if unit else f"{count} bytes"


def parse_size(text: str) -> int:
    """'100G', '512M', '2T', '1000' (bytes) -> bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 10, "M": 20, "G": 30, "T": 40}.get(text[-1:], 0)
    digits = text[:-1] if scale else text
    if not digits.isascii() or not digits.isdigit():
        raise ConfigError(f"--limit {text!r} is not a size", fix="e.g. --limit 200G")
    return int(digits) << scale


def _failure(node: NodeRecord, path: str, dest: str, code: int, said: str,
             run_id: str) -> Fetched:
    if "No such file or directory" in said and code == 23:
        return Fetched(node.label, path, dest,
                       f"{path} is not in the run's workdir {node.workdir or '~'}",
                       f"see what is there: `multihost ssh {node.rank_offset} --run {run_id}`, "
                       f"then `ls`")
    return Fetched(node.label, path, dest,
                   *rsync_failure(code, said, node.label, node.label,
                                  again="run the same `multihost fetch` again"))
