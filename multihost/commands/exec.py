"""``multihost exec``: one command on every host in parallel, output grouped like clush -b."""
from __future__ import annotations

import argparse
import shlex
import sys
import threading
from typing import Dict, List, Tuple

from .common import HOST_OPTIONS_HELP, add_host_options

EPILOG = HOST_OPTIONS_HELP + """
examples:
  multihost exec --ips=10.0.0.1,10.0.0.2 -- nvidia-smi -L
  multihost exec --hostfile hosts.ini -- 'df -h /data | tail -1'
  multihost exec --hostfile hosts.ini --plain -- python3 -c 'import torch; print(torch.__version__)'

A single argument is a shell command line (pipes and $VARS work, as with ssh); several
arguments are one argv, each quoted, so nothing in them is re-parsed by a shell.
It runs in the login directory, or in --workdir DIR (relative to HOME, as with ssh; a
hostfile's workdir is not used: it may not exist before the first sync).
Hosts with identical output and exit status are shown once, under their folded names.
Exit status: the largest of the hosts' (255 when a host could not be reached).
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("exec", help="run a command on every host in parallel",
                            description="Run a command on every host in parallel.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_host_options(parser)
    parser.add_argument("--plain", action="store_true",
                        help="stream 'host: line' as lines arrive instead of grouping")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="fail a host whose command runs longer than S seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    return parser


def _command(args: argparse.Namespace):
    from ..errors import ConfigError

    words = list(args.command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise ConfigError("no command given", fix="write it after --, e.g. multihost exec -- hostname")
    if len(words) > 1:
        return words
    # One word is a line for a shell: the user's login shell, as `ssh host LINE` runs it
    # (multihost's own commands run under sh whatever the login shell is).
    return 'exec "${SHELL:-/bin/sh}" -c ' + shlex.quote(words[0])


def _workdir(args: argparse.Namespace):
    """--workdir as every host's shell sees it: relative to HOME, like ssh (also on the
    host that is this machine, which runs in the controller's directory otherwise)."""
    workdir = args.workdir
    if workdir is None or workdir.startswith(("/", "~")):
        return workdir
    return "~/" + workdir


def main(args: argparse.Namespace) -> int:
    from .common import cluster_from_args

    command = _command(args)
    cwd = _workdir(args)
    from ..machines import refuse_same_machine

    with cluster_from_args(args) as cluster:
        refuse_same_machine(cluster)  # else the command would run twice on it
        if args.plain:
            return _run_plain(cluster, command, args.timeout, cwd)
        results = cluster.map(lambda host, t: t.run(command, timeout=args.timeout, cwd=cwd))
    return print_grouped(results, sys.stdout, sys.stderr)


Outcome = Tuple[int, bytes, bytes]


def group_outcomes(results) -> List[Tuple[List[str], Outcome]]:
    """Hosts with the same (exit, stdout, stderr) together, groups in first-host order."""
    groups: Dict[Outcome, List[str]] = {}
    for result in results:
        if result.ok:
            value = result.value
            key = (value.exit_code, value.stdout, value.stderr)
            groups.setdefault(key, []).append(result.host.label)
    return [(names, key) for key, names in groups.items()]


def exit_status(results) -> int:
    from ..errors import EXIT_CONNECT, ConnectError

    codes = [r.value.exit_code if r.ok else
             (EXIT_CONNECT if isinstance(r.error, ConnectError) else 1) for r in results]
    return max(codes) if codes else 0


def print_grouped(results, out, err) -> int:
    from ..nodeset import fold

    for names, (code, stdout, stderr) in group_outcomes(results):
        title = f"{fold(names)} ({len(names)})" + (f" exit {code}" if code else "")
        out.write(f"{'-' * 15}\n{title}\n{'-' * 15}\n")
        out.write(stdout.decode("utf-8", "replace"))
        if stdout and not stdout.endswith(b"\n"):
            out.write("\n")
        out.flush()
        if stderr:
            err.write(stderr.decode("utf-8", "replace"))
            err.flush()
    for result in results:
        if not result.ok:
            err.write(f"multihost: {result.error}\n")
    return exit_status(results)


def _run_plain(cluster, command, timeout, cwd=None) -> int:
    lock = threading.Lock()

    def stream(host, transport):
        process = transport.start(command, cwd=cwd)
        process.stdin.close()
        for raw in process.stdout:
            with lock:
                sys.stdout.write(f"{host.label}: {raw.decode('utf-8', 'replace').rstrip(chr(10))}\n")
                sys.stdout.flush()
        stderr = process.read_stderr()
        code = process.wait(timeout)
        process.close()
        with lock:
            for line in stderr.decode("utf-8", "replace").splitlines():
                sys.stderr.write(f"{host.label}: {line}\n")
            if code:
                sys.stderr.write(f"{host.label}: exit {code}\n")
        return _Exit(code)

    results = cluster.map(stream)
    for result in results:
        if not result.ok:
            sys.stderr.write(f"multihost: {result.error}\n")
    return exit_status(results)


class _Exit:
    """What plain mode keeps of a host's run: only the status (the lines were printed)."""

    def __init__(self, code: int):
        self.exit_code = code
