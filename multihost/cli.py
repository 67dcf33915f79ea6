# PYTHON_ARGCOMPLETE_OK (argcomplete's global completion looks for this line)
"""The ``multihost`` command: parses arguments, dispatches to a command module, and is
the one place where errors become a single line and an exit code.

Command modules live in ``multihost.commands``; each has ``register(subparsers)`` and
``main(args) -> int``. Only the module of the command being run is imported: the others
appear in ``multihost --help`` by their line in ``COMMANDS``.
"""
from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys
from typing import Callable, List, Optional

from . import __version__
from .errors import EXIT_INTERRUPTED, MultihostError

PIPE_COMMANDS = ("logs", "exec", "status")
EXIT_CLOSED_PIPE = 128 + 13  # what a shell reports for a reader gone (`yes | head -1`)

# Each command and its line in `multihost --help`, in that order. The line is the same
# as the `help=` its module's register() gives (tests/unit/cli/test_cli.py compares them):
# kept here so that the listing needs none of the modules.
COMMANDS = {
    "check": "preflight: prove the cluster can run the job",
    "sync": "make the code (and check data) identical on every host",
    "run": "check, sync, launch on every host in ip order, follow",
    "fleetrun": "fleetrun / paddle.distributed.launch's command line, on every machine",
    "rerun": "start a recorded run again, as it was",
    "scale": "measure throughput on 1, 2, 4, ... hosts: speed-up and scaling efficiency",
    "logs": "show or follow the logs of a run",
    "status": "show every node of a run (any run, any shell)",
    "stop": "stop a run on every host (any run, any shell)",
    "stacks": "the Python stack of every rank of a running job",
    "fetch": "copy a run's outputs (checkpoints, results) back here",
    "exec": "run a command on every host in parallel",
    "ssh": "an interactive shell on a host of a run, in its workdir",
    "lab": "a local multi-host lab with real sshd (needs root)",
    "completion": "print the shell code for Tab completion",
}

DESCRIPTION = """\
Run one distributed training job across several machines from one controller, over SSH.

  multihost check --ips=a,b                       preflight: is this cluster ready?
  multihost run --ips=a,b -- train.py -c cfg.yml  check, sync, launch in ip order, follow
  multihost logs --follow                         reattach to the logs of the last run
"""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line like every other error: the cause and the fix,
    not a usage block. Subparsers inherit the class, so each names its own --help."""

    def __init__(self, *args, **kwargs):
        # No prefixes: `--gpu 0` must not silently mean `--gpus 0` (and `--wait` is not
        # `--wait-...`): a flag is spelled out or refused.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        command = self.prog.partition(" ")[2]
        where = f"{command}: " if command else ""
        print(f"multihost: {where}{message} (fix: see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``only``, of just that one (``rerun`` parses a
    recorded run's words with ``run``'s)."""
    return _parser(lambda name: only is None or name == only, list_others=False)


def parser_for(command: Optional[str]) -> argparse.ArgumentParser:
    """The parser that lists every command (by its line in ``COMMANDS``) but knows the
    options of ``command`` alone (of none with None): only its module is imported."""
    return _parser(lambda name: name == command, list_others=True)


def _parser(load: Callable[[str], bool], list_others: bool) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="multihost", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"multihost {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, line in COMMANDS.items():
        if load(name):
            module = importlib.import_module(f"multihost.commands.{name}")
            command_parser = module.register(sub)
            # Not `command`: exec's and run's own positional words are stored under that name.
            command_parser.set_defaults(_module=module, _parser=command_parser, _name=name)
        elif list_others:
            sub.add_parser(name, help=line)
    return parser


def command_named(argv: List[str]) -> Optional[str]:
    """The command the words name: the first that is not a flag (the top level's flags,
    --help and --version, take no value)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Optional[List[str]] = None) -> int:
    """The ``multihost`` command (and ``python -m multihost``): its exit code."""
    try:
        code = dispatch(argv)
        for stream in (sys.stdout, sys.stderr):  # here, where a reader gone is handled
            if stream is not None:
                stream.flush()
        return code
    except BrokenPipeError:
        # The reader of our output left (`check | head -1`, `stop --json | head`), which
        # is its right. Any other broken pipe is a bug worth its traceback.
        if not output_closed():
            raise
        silence_stdout()
        return EXIT_CLOSED_PIPE


# Commands whose words after `--` are new arguments for the job, not for the command: they
# are put aside before argparse, which would take the first one for a positional
# (`rerun -- --resume x`: the run id "--resume").
REST_COMMANDS = ("rerun",)


def split_rest(argv: List[str]):
    """(argv, the words after `--` or None) for REST_COMMANDS; argv as it is otherwise."""
    command = next((word for word in argv if not word.startswith("-")), None)
    if command not in REST_COMMANDS or "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def dispatch(argv: Optional[List[str]] = None) -> int:
    if "_ARGCOMPLETE" in os.environ:  # a Tab in the shell: answer it and exit
        complete(build_parser())
    words, rest = split_rest(list(sys.argv[1:] if argv is None else argv))
    parser = parser_for(command_named(words))
    try:
        # A flag's own type check (a port, a count) raises our errors from inside argparse.
        args, unknown = parser.parse_known_args(words)
        if rest is not None:
            args.rest = rest
        if unknown:  # named by the command's parser, so the fix points at its --help
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    except MultihostError as err:
        print(f"multihost: {err}", file=sys.stderr)
        return err.exit_code
    module = getattr(args, "_module", None)
    if module is None:
        parser.print_help()
        return 2
    # A closed pipe (`multihost logs | head`) is not an error worth a traceback; only for
    # the commands whose output is meant for pipes: elsewhere a dead ssh child's pipe
    # must be an error that is handled, not a silent death.
    if args._name in PIPE_COMMANDS and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return int(module.main(args) or 0)
    except MultihostError as err:
        print(f"multihost: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        # The terminal echoed ^C where the cursor was (after a progress line, the
        # dashboard's footer): the word starts a line of its own.
        print(("\n" if sys.stderr.isatty() else "") + "multihost: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def complete(parser: argparse.ArgumentParser) -> None:
    """Shell completion (see `multihost completion`): every command's parser, with the
    completers of run ids and hosts (commands/complete.py)."""
    import argcomplete

    from .commands.complete import (complete_hostfile_hosts, complete_launchers,
                                    complete_run_hosts, complete_run_ids)

    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for command in action.choices.values():
            for option in command._actions:
                if option.dest == "run" and not getattr(option, "completer", None):
                    option.completer = complete_run_ids
                elif option.dest == "host":
                    option.completer = complete_run_hosts
                elif option.dest == "ips":
                    option.completer = complete_hostfile_hosts
                elif option.dest == "launcher":
                    option.completer = complete_launchers
    argcomplete.autocomplete(parser)


def output_closed() -> bool:
    """Whether stdout or stderr is a pipe whose reader is gone (poll says POLLERR for the
    writing end of a pipe with no reader left; never for a terminal or a file)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            poller = select.poll()
            poller.register(stream.fileno(), 0)  # errors are always reported
            if any(events & select.POLLERR for _, events in poller.poll(0)):
                return True
        except (AttributeError, OSError, ValueError):
            continue
    return False


def silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is still
    buffered does not fail a second time on its way out."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
