"""The srun transport: a node of the Slurm allocation runs a command as a job step,

    srun --overlap --nodes=1 --ntasks=1 -w NODE --jobid JOB ... /bin/sh -c LINE

so Slurm starts it, tracks it, and ends it with the allocation; no sshd is needed. The
step is a local ``srun`` process whose pipes are the command's streams, so everything
else is the local transport's.

Why each option:
- ``--overlap``: a second step in an allocation waits until the first ends ("Requested
  nodes are busy") unless both overlap; multihost's probes and log streams run beside
  the training step.
- ``--nodes=1 --ntasks=1 -w NODE``: one task on that node, as ssh would run one command.
- ``-u`` (unbuffered): streams pass as they are written, bytes not lines (the helper's
  frames are binary).
- ``--quiet``: no "job step created" chatter on stderr; srun's own report of a task's
  exit ("srun: error: h2: task 0: Exited with exit code 3") is taken out of stderr too,
  as the exit status already says it.

A login starts in the user's home with HOME from the password database; srun exports
the caller's environment, HOME and cwd included, so the line first goes home like ssh.
"""
from __future__ import annotations

import re
import shlex
import signal
import subprocess
from dataclasses import dataclass
from typing import List, Optional

from ..errors import ConnectError
from ..hosts import Host
from .base import Command, CommandResult, Process, SshOptions
from .local import LocalProcess, LocalTransport
from .openssh import client_argv

# What a login would do first: the node's own home for this user, and start there.
GO_HOME = ('HOME=$(getent passwd "$(id -u)" | cut -d: -f6); export HOME; '
           'cd "$HOME" 2>/dev/null || cd /; ')
# srun's own lines about a task's end: the exit status carries them.
_TASK_REPORT = re.compile(rb"^srun: error: [^:\s]+: tasks? [0-9,-]+: "
                          rb"(Exited with exit code \d+|Terminated|Killed|[A-Za-z ]+)\n?$")
TERM_GRACE = 3.0   # seconds srun gets to end its step after SIGTERM before SIGKILL
# srun's own failures to start a step: the command never ran.
_NO_STEP = re.compile(r"^srun: error: (Unable to confirm allocation for job \S+|"
                      r"Unable to create step for job \S+|Slurm job \S+ has expired)(: (.*))?$",
                      re.M)
_JOB_GONE = ("Invalid job id", "has expired", "already completing or completed")


def clean_stderr(data: bytes) -> bytes:
    return b"".join(line for line in data.splitlines(keepends=True)
                    if not _TASK_REPORT.match(line))


def step_error(stderr: bytes, node: str, job_id: str) -> Optional[ConnectError]:
    """The error when srun could not start the step at all (so nothing ran on the node)."""
    match = _NO_STEP.search(stderr.decode("utf-8", "replace"))
    if not match:
        return None
    said = match.group(0)[len("srun: error: "):]
    if any(word in said for word in _JOB_GONE):
        why = "" if said.startswith("Slurm job") else f" ({said})"
        return ConnectError(f"Slurm job {job_id} has ended{why}", host=node,
                            kind=ConnectError.LOST,
                            fix="the allocation is over (scancel, or its time limit): "
                                "salloc again, or use multihost run --slurm")
    return ConnectError(f"srun could not start a step of Slurm job {job_id} here ({said})",
                        host=node, kind=ConnectError.UNREACHABLE,
                        fix=f"check that {node} is a node of the job: squeue -j {job_id} -o %N")


def srun_argv(node: str, job_id: str, line: str, srun: str = "srun") -> List[str]:
    return [srun, "--overlap", "--nodes=1", "--ntasks=1", "-w", node, "--jobid", str(job_id),
            "--job-name=multihost", "--quiet", "-u", "/bin/sh", "-c", GO_HOME + line]


def step_options(job_id: str, srun: str = "srun") -> List[str]:
    """srun as one task on one node of job ``job_id`` (the node's ``-w`` still to come)."""
    return [srun, "--overlap", "--nodes=1", "--ntasks=1", "--jobid", str(job_id),
            "--job-name=multihost", "--quiet"]


def remote_shell(host: Host, options: SshOptions) -> List[str]:
    """What runs a program on ``host`` as a run's commands reach it, called as
    ``argv + [host.name, PROGRAM, ARG...]``: rsync's remote shell (``-e``). ssh, or for
    a node of a Slurm job a step that first goes home as a login would (so a path
    relative to the home means the same through both)."""
    if not isinstance(options, SrunOptions):
        return client_argv(host, options)
    # rsync puts the node name first: the wrapper takes it for -w; -u passes rsync's
    # protocol bytes as they come (srun holds back output until a newline otherwise).
    script = ('node=$1; shift; exec ' + shlex.join(step_options(options.job_id) + ["-u"]) +
              ' -w "$node" /bin/sh -c "$0" sh "$@"')
    return ["/bin/sh", "-c", script, GO_HOME + 'exec "$@"']


def terminal_argv(host: Host, options: SshOptions, line: str) -> List[str]:
    """An interactive session on ``host`` that runs the shell ``line`` at home, with a
    terminal: ``ssh -t``, or for a node of a Slurm job ``srun --pty`` (its login shell
    from the password database, as ssh would take it)."""
    if isinstance(options, SrunOptions):
        return step_options(options.job_id) + [
            "-w", host.name, "--pty", "/bin/sh", "-c",
            GO_HOME + 'SHELL=$(getent passwd "$(id -u)" | cut -d: -f7); export SHELL; ' + line]
    argv = [word if word != "-T" else "-t" for word in client_argv(host, options)]
    return argv + ["--", host.name, line]


@dataclass(frozen=True)
class SrunOptions(SshOptions):
    """A command's hosts are nodes of Slurm job ``job_id``, reached by srun (the ssh
    fields stay for whatever still goes over ssh, such as rsync to a node)."""

    job_id: str = ""


class SrunProcess(LocalProcess):
    def read_stderr(self) -> bytes:
        return clean_stderr(super().read_stderr())

    def kill(self) -> None:
        # SIGTERM has srun cancel its step on the node (tasks get SIGTERM, then SIGKILL
        # after KillWait); a SIGKILLed srun leaves the step to notice its lost I/O.
        popen = self._popen
        if popen.poll() is not None:
            return
        try:
            popen.send_signal(signal.SIGTERM)
            popen.wait(TERM_GRACE)
        except subprocess.TimeoutExpired:
            super().kill()
        except OSError:
            pass


class SrunTransport(LocalTransport):
    """A node of the allocation ``job_id``; ``host.name`` is its Slurm node name."""

    is_local = False

    def __init__(self, host: Host, job_id: str):
        super().__init__(host)
        self.job_id = str(job_id)

    def run(self, command: Command, *, input: Optional[bytes] = None,
            timeout: Optional[float] = None, cwd: Optional[str] = None) -> CommandResult:
        result = super().run(command, input=input, timeout=timeout, cwd=cwd)
        if result.exit_code != 0 and not result.stdout:
            error = step_error(result.stderr, self.host.label, self.job_id)
            if error:
                raise error
        return CommandResult(result.host, result.command, result.exit_code, result.stdout,
                             clean_stderr(result.stderr), result.duration)

    def start(self, command: Command, *, cwd: Optional[str] = None) -> Process:
        process = super().start(command, cwd=cwd)
        assert isinstance(process, LocalProcess)
        return SrunProcess(process._popen, self.host.label)

    def _argv(self, line: str) -> list:
        return srun_argv(self.host.name, self.job_id, line)


def record_fields(options: SshOptions) -> dict:
    """What a run's record keeps (beside the ssh settings) so that `stop`, `status` and
    `logs` from any shell reach its nodes as the run did."""
    if isinstance(options, SrunOptions):
        return {"transport": "srun", "job_id": options.job_id}
    return {}


def from_record(ssh: dict, options: SshOptions) -> SshOptions:
    """``options`` as the run's record says its nodes are reached (see record_fields)."""
    if (ssh or {}).get("transport") == "srun" and ssh.get("job_id"):
        return SrunOptions(**vars(options), job_id=str(ssh["job_id"]))
    return options
