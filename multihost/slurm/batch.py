"""`multihost run --slurm -N 2 --detach -- train.py`: the run as a Slurm batch job.

A detached run needs a controller that outlives this shell, and Slurm already keeps one:
the batch script, started by slurmd on the allocation's first node. So the request is
``sbatch --parsable --nodes=N ...`` with a script (fed on stdin: sbatch keeps a copy)
whose one line is the same ``multihost run`` without the Slurm flags; inside the job it
takes the allocation's nodes through srun, as any run inside ``sbatch`` does. Queueing,
the time limit, accounting and the output file (``slurm-%j.out`` in the submit directory
unless the site's or the user's sbatch defaults say otherwise) are Slurm's.

``~/.multihost/slurm/JOB.json`` records the submission (the record ``run --slurm`` keeps
while it waits, with ``batch``, ``output`` and ``submitted``), so that ``status``,
``logs --follow`` and ``stop`` on the login node find the job. Its state is Slurm's:
``scontrol show job -o N`` (kept for minutes after the end), else squeue.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import ConfigError, LaunchError, MultihostError
from ..untrusted import clean_text
from .ending import parse_scontrol
from .submit import QUEUE_DIR, Ask, queue_path, queued_line

QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
LIVE = QUEUED | {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING",
                 "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"}
KEEP_RECORDS = 50          # the newest batch submissions kept under ~/.multihost/slurm
READ_CHUNK = 1 << 16       # an output file is read this much at a time, never whole


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: Optional[str]            # Slurm's JobState; None: Slurm no longer knows the job
    reason: str = ""
    exit_code: Optional[int] = None
    signal: int = 0
    nodes: str = ""                 # Slurm's NodeList, e.g. h[1-2]
    output: str = ""                # Slurm's StdOut path

    @property
    def queued(self) -> bool:
        return self.state in QUEUED

    @property
    def ended(self) -> bool:
        return self.state not in LIVE

    @property
    def failed(self) -> bool:
        return self.ended and (self.state != "COMPLETED" or bool(self.exit_code or self.signal))


def sbatch_argv(ask: Ask, name: str = "multihost") -> List[str]:
    return ["sbatch", "--parsable", f"--nodes={ask.nodes}", f"--job-name={name}", *ask.limits()]


def batch_script(run_argv: Sequence[str]) -> str:
    """The batch script: the run itself, as the job's one process on its first node."""
    return ("#!/bin/sh\n# multihost run --slurm --detach: the run, on this job's nodes\n"
            f"exec {shlex.join(run_argv)}\n")


def state_of(job_id: str, fields: Dict[str, str]) -> Optional[JobState]:
    """A JobState from scontrol's fields (ending.parse_scontrol); None without a JobState."""
    if "JobState" not in fields:
        return None
    code, _, sig = fields.get("ExitCode", "").partition(":")
    return JobState(job_id, fields["JobState"], "" if fields.get("Reason") == "None"
                    else fields.get("Reason", ""), int(code) if code.isdigit() else None,
                    int(sig) if sig.isdigit() else 0,
                    "" if fields.get("NodeList") == "(null)" else fields.get("NodeList", ""),
                    fields.get("StdOut", ""))


def _ask(argv: List[str]) -> Optional[str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def job_state(job_id: str) -> JobState:
    """Slurm's view of the job now: scontrol (which also knows a job that ended minutes
    ago), else squeue, else unknown (state None)."""
    found = state_of(job_id, parse_scontrol(_ask(["scontrol", "show", "job", "-o", str(job_id)])
                                            or ""))
    if found is not None:
        return found
    out = (_ask(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r|%N"]) or "").strip()
    if out:
        state, reason, nodes = (out.splitlines()[0].split("|") + ["", ""])[:3]
        return JobState(job_id, state, "" if reason == "None" else reason, nodes=nodes)
    return JobState(job_id, None)


def submit(ask: Ask, run_argv: Sequence[str], name: str = "multihost",
           cwd: Optional[str] = None) -> dict:
    """Submit the run as a batch job; its record (also written to ~/.multihost/slurm)."""
    if ask.nodes < 1:
        raise ConfigError(f"-N {ask.nodes}: an allocation has at least one node", fix="-N 2")
    argv = sbatch_argv(ask, name)
    cwd = cwd or os.getcwd()
    try:
        done = subprocess.run(argv, input=batch_script(run_argv), capture_output=True, text=True,
                              timeout=60, cwd=cwd)
    except FileNotFoundError:
        raise ConfigError("--slurm --detach needs Slurm's sbatch, and it is not on PATH",
                          fix="run on a Slurm login node, or leave out --slurm") from None
    except subprocess.TimeoutExpired:
        raise LaunchError("sbatch did not answer within 60s",
                          fix="check the controller: sinfo; then submit again") from None
    said = (done.stderr.strip().splitlines() or [f"sbatch exited {done.returncode}"])[-1]
    job = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job.isdigit():
        raise LaunchError(f"Slurm refused the batch job: {said}",
                          fix="try the request by hand: " + shlex.join(
                              ["sbatch", "--test-only", *argv[2:], "--wrap", "hostname"]))
    now = time.time()
    record = {"job_id": job, "nodes": ask.nodes, "partition": ask.partition, "since": now,
              "batch": True, "output": str(Path(cwd) / f"slurm-{job}.out"), "submitted": now,
              "workdir": cwd, "name": name}
    record["output"] = output_of(record, job_state(job))
    path = queue_path(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record) + "\n")
    _prune()
    return record


def records() -> List[dict]:
    """The batch submissions recorded here, newest first."""
    found = []
    directory = QUEUE_DIR.expanduser()
    for path in directory.glob("*.json") if directory.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("batch") \
                and str(record.get("job_id", "")).isdigit():
            found.append(record)
    return sorted(found, key=lambda r: float(r.get("submitted") or 0), reverse=True)


def _prune() -> None:
    for old in records()[KEEP_RECORDS:]:
        try:
            queue_path(old["job_id"]).unlink()
        except OSError:
            pass


def pick(run: Optional[str], last_run_created: Optional[float]) -> Optional[dict]:
    """The batch job a command without a run id (or with a Slurm job id) means: the newest
    submission, unless a run recorded here is newer (a shared home shows the batch run's
    own record: its view is the fuller one)."""
    known = records()
    if run is not None:
        return next((r for r in known if r["job_id"] == run), None)
    if not known or (last_run_created or 0) > float(known[0].get("submitted") or 0):
        return None
    return known[0]


def output_of(record: dict, state: JobState) -> str:
    """The job's output file. Slurm shows it with its pattern filled in; an older one
    may show the pattern (``%j``, ``%x``, ``%u``) as given."""
    path = state.output or record.get("output") or ""
    if "%" in path:
        for key, value in (("%%", "\0"), ("%j", record["job_id"]), ("%A", record["job_id"]),
                           ("%x", record.get("name") or "multihost"), ("%u", _user())):
            path = path.replace(key, value)
        path = path.replace("\0", "%")
    return path


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def line(record: dict, state: JobState) -> str:
    """One line for `multihost status`: queued, running, or how it ended."""
    job, output = record["job_id"], clean_text(output_of(record, state))
    if state.queued:
        return queued_line({"job_id": job, "reason": clean_text(state.reason),
                            "state": state.state})
    if not state.ended:
        doing = "running" if state.state == "RUNNING" else clean_text(state.state).lower()
        return f"{doing} as Slurm job {job} on {clean_text(state.nodes) or '?'}; output: {output}"
    return f"{ended_text(state)}; output: {output}"


def ended_text(state: JobState) -> str:
    if state.state is None:
        return f"Slurm job {state.job_id} ended (Slurm no longer knows how)"
    code = "" if state.exit_code is None else f", exit {state.exit_code}"
    sig = f", signal {state.signal}" if state.signal else ""
    return f"Slurm job {state.job_id} ended: {clean_text(state.state)}{code}{sig}"


def to_json(record: dict, state: JobState) -> dict:
    shown = "queued" if state.queued else "ended" if state.ended else "running"
    return {"state": shown, "slurm_job": record["job_id"], "slurm_state": state.state,
            "reason": state.reason, "nodes": record.get("nodes"), "nodelist": state.nodes,
            "exit_code": state.exit_code, "signal": state.signal,
            "output": output_of(record, state), "batch": True, "submitted": record.get("submitted")}


def cancel(job_id: str, timeout: float = 60.0, poll: float = 0.5) -> JobState:
    """scancel, then wait (bounded) until Slurm says the job has ended on every node."""
    try:
        done = subprocess.run(["scancel", str(job_id)], capture_output=True, text=True,
                              timeout=30, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ConfigError("stopping a Slurm job needs scancel, and it is not on PATH",
                          fix="run on a Slurm login node") from None
    if done.returncode != 0 and not job_state(job_id).ended:
        said = (done.stderr.strip().splitlines() or [f"scancel exited {done.returncode}"])[-1]
        raise MultihostError(f"scancel {job_id} failed: {said}", fix=f"scancel {job_id}")
    deadline = time.monotonic() + timeout
    while True:
        state = job_state(job_id)
        if state.ended:
            return state
        if time.monotonic() > deadline:
            raise MultihostError(f"Slurm job {job_id} is still {state.state} {timeout:.0f}s "
                                 "after scancel",
                                 fix=f"squeue -j {job_id}; scancel --signal=KILL {job_id}")
        time.sleep(poll)


def unreadable(record: dict, state: JobState) -> MultihostError:
    from .allocation import expand_nodelist

    path = output_of(record, state)
    nodes = expand_nodelist(state.nodes) if state.nodes else ()
    node = nodes[0] if nodes else "the job's first node"
    fix = (f"srun --overlap --jobid {state.job_id} -w {node} tail -n +1 -f {shlex.quote(path)}"
           if nodes and not state.ended else f"ssh {node} cat {shlex.quote(path)}")
    return MultihostError(f"the output of Slurm job {state.job_id} is {path} on {node}, not "
                          "readable from here (submit from a directory every node shares to "
                          "follow it from here)", host=node if nodes else None, fix=fix)


def follow(record: dict, write: Callable[[bytes], None], follow: bool = True,
           poll: float = 0.5, ask_every: float = 2.0, grace: float = 10.0) -> JobState:
    """Write the job's output file as it grows, ``READ_CHUNK`` at a time, until the job
    ends (or, without ``follow``, what it holds now); the job's state at the end. The
    file is read every ``poll`` seconds, slurmctld asked every ``ask_every``. A file not
    seen here ``grace`` seconds after the job started is on its node only."""
    job = record["job_id"]
    handle = None
    missing_since: Optional[float] = None
    asked = 0.0
    try:
        while True:
            if time.monotonic() - asked >= ask_every:
                # Asked before the file is read: once the job has ended, this read is
                # the last and has every line.
                state, asked = job_state(job), time.monotonic()
            path = output_of(record, state)
            if handle is None and not state.queued:
                try:
                    handle = open(path, "rb")
                except OSError:
                    missing_since = missing_since or time.monotonic()
                    if state.ended or not follow or time.monotonic() - missing_since > grace:
                        raise unreadable(record, state) from None
            while handle is not None:
                chunk = handle.read(READ_CHUNK)
                if not chunk:
                    break
                write(chunk)
            if state.ended or not follow:
                return state
            time.sleep(poll)
    finally:
        if handle is not None:
            handle.close()


def exit_status(state: JobState) -> int:
    """The job's status as a shell would give it (128+N for signal N)."""
    if state.signal:
        return 128 + state.signal
    return state.exit_code or (1 if state.failed else 0)


__all__ = ["JobState", "batch_script", "cancel", "exit_status", "follow", "job_state",
           "line", "pick", "records", "sbatch_argv", "state_of", "submit", "to_json"]
