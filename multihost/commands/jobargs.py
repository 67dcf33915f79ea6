"""``run -f job.toml``: a job file fills the arguments before the rest of ``run`` reads
them, so every later step sees one namespace whichever way a value was given."""
from __future__ import annotations

import argparse
import sys
from typing import Any, List


def keep_words(parser: argparse.ArgumentParser) -> None:
    """Keep the words the command line gave this (sub)parser on the namespace: a job file
    goes in front of them, so a flag typed there beats the file's."""
    parse = parser.parse_known_args

    def parse_and_keep(args=None, namespace=None):
        namespace, extras = parse(args, namespace)
        namespace._words = list(sys.argv[1:] if args is None else args)
        return namespace, extras

    parser.parse_known_args = parse_and_keep  # type: ignore[method-assign]


def with_job_file(args: argparse.Namespace) -> argparse.Namespace:
    """The namespace of the job file's flags, then the command line's; the command line's
    script beats the file's ``command``, its --ips/--hostfile the file's hosts."""
    from ..run import jobfile
    from ..errors import ConfigError

    path = getattr(args, "job_file", None)
    if not path:
        return args
    table = jobfile.load(path)
    if args.ips is not None or args.hostfile is not None:
        table = {k: v for k, v in table.items() if k not in ("hosts", "hostfile")}
    if "hosts" in table and "hostfile" in table:
        raise ConfigError(f"{path}: both hosts and hostfile are given", fix="keep one of them")
    words, command = jobfile.to_words(table, path)
    typed = list(getattr(args, "_words", []))
    script = list(args.command)
    flags = typed[:len(typed) - len(script)] if script else typed
    if script[1:] or (script and script[0] != "--"):
        command = []  # the command line's script wins
    tail: List[str] = script if not command else ["--"] + command
    parser = args._parser
    try:
        parser.parse_known_args(words + ["--", "x"])  # the file's values alone, named as its
    except ConfigError as err:
        raise ConfigError(f"{path}: {err.cause}", fix=err.fix) from None
    merged, unknown = parser.parse_known_args(words + flags + tail)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    for name in ("_module", "_parser", "_hosts"):
        if hasattr(args, name):
            setattr(merged, name, getattr(args, name))
    return merged


def defaults(args: argparse.Namespace) -> Any:
    parser = args._parser
    return {action.dest: action.default for action in parser._actions}
