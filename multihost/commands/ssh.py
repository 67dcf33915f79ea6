"""``multihost ssh RANK|HOST``: an interactive shell on a host of a run, in its workdir."""
from __future__ import annotations

import argparse
import os
import shlex
from typing import List

EPILOG = """\
examples:
  multihost ssh 0                  the host of global rank 0 of the last run
  multihost ssh 198.18.0.12        that host, by name as the run lists it
  multihost ssh 3 --run 20261121   global rank 3 of another run (a unique prefix will do)

The shell opens in the run's workdir on that host (where the code was synced). It is the
system `ssh`, reaching the host as multihost does: its user, port and key, your ssh
config (ProxyJump included), and strict host-key checking. For a run whose nodes are
steps of a Slurm job it is `srun --pty`, a step of that job (no sshd needed).
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("ssh", help="an interactive shell on a host of a run, in its workdir",
                            description="Open an interactive shell on a host of a run.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_argument("target", metavar="RANK|HOST",
                                 help="a global rank (as in `logs --rank`) or a host of the run")
    run = parser.add_argument("--run", help="run id (default: the last run)")
    try:
        from .complete import complete_run_ids, complete_run_targets
    except ImportError:
        pass
    else:
        target.completer = complete_run_targets
        run.completer = complete_run_ids
    return parser


def find_node(record, target: str):
    """The node of the run that ``target`` names: a global rank, or a host as listed."""
    from ..errors import ConfigError

    world = sum(record.nprocs)
    if target.isdigit():
        rank = int(target)
        for node in record.nodes:
            if node.rank_offset <= rank < node.rank_offset + node.nproc:
                return node
        raise ConfigError(f"run {record.run_id} has no rank {rank}: its ranks are 0-{world - 1}",
                          fix="give a rank from that range, or a host name")
    for node in record.nodes:
        if target in (node.label, str(node.host.get("name"))):
            return node
    names = ", ".join(node.label for node in record.nodes[:8])
    raise ConfigError(f"run {record.run_id} has no host {target!r} (its hosts: {names})",
                      fix="name one of its hosts, as listed, or give a global rank")


def shell_argv(host, options, workdir: str) -> List[str]:
    """A login shell in ``workdir`` with a terminal, reaching the host as the run did:
    the system `ssh` with multihost's own options (user, port, key, config, strict host
    keys), or `srun --pty` for a node of a Slurm job."""
    from ..transport.srun import terminal_argv

    remote = f"cd {shlex.quote(workdir)} && exec \"${{SHELL:-/bin/sh}}\" -l" if workdir \
        else "exec \"${SHELL:-/bin/sh}\" -l"
    return terminal_argv(host, options, remote)


def main(args: argparse.Namespace) -> int:
    from ..errors import ConfigError, ConnectError
    from ..run.control import ssh_options
    from ..run.records import host_from_dict, load_run
    from ..transport import is_local_host

    record = load_run(args.run)
    node = find_node(record, args.target)
    host = host_from_dict(node.host)
    if is_local_host(host):  # this machine: a shell here, no ssh
        try:
            os.chdir(node.workdir or os.path.expanduser("~"))
        except OSError as exc:
            raise ConfigError(f"cannot enter {node.workdir}: {exc.strerror}", host=node.label,
                              fix=f"see `multihost status {record.run_id}`") from None
        shell = os.environ.get("SHELL") or "/bin/sh"
        os.execvp(shell, [shell, "-l"])
    options = ssh_options(record)
    job = getattr(options, "job_id", "")
    if job:   # a node of a Slurm job: srun reaches it only while the job lives
        from ..slurm.ending import job_end

        ended = job_end(job)
        if ended is not None:
            line = f"cd {shlex.quote(node.workdir or '.')} && exec $SHELL -l"
            raise ConnectError(f"Slurm job {job} {ended.ending.words}: srun reaches none of "
                               "its nodes now", host=node.label, kind=ConnectError.LOST,
                               fix=f"where the site allows ssh: ssh -t {host.name} "
                                   f"{shlex.quote(line)}")
    argv = shell_argv(host, options, node.workdir)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        raise ConfigError(f"cannot start {argv[0]}: {exc.strerror}", host=node.label,
                          fix="install the OpenSSH client (openssh-client)" if argv[0] == "ssh"
                          else "run it where Slurm's commands are (a login node)") from None
    return 0
