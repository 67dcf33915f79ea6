"""``multihost fetch [RUN] PATH... [--to DIR] [--all]``: a run's outputs back to this machine."""
from __future__ import annotations

import argparse
import sys

EPILOG = """\
examples:
  multihost fetch output/best_model            rank 0's host, this directory's last run, into ./output/
  multihost fetch ckpt.pt --to /data/runs/a    into /data/runs/a/ckpt.pt
  multihost fetch --all log.txt                every host's, into ./<host>/log.txt
  multihost fetch 20261127-101500-3f2a output  another run's (a run id first)

PATH is relative to the run's workdir on the host (where its code was synced). The copy
is rsync over ssh, reaching the host as multihost does (over srun for a run whose nodes
are steps of a Slurm job): a file already here and unchanged is skipped, a copy cut half
way resumes where it stopped when the command is run again.
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("fetch", help="copy a run's outputs (checkpoints, results) back here",
                            description="Copy files or directories from a run's workdir on "
                                        "its hosts to this machine.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="[RUN] PATH",
                        help="a run id first (default: the last run of the code directory you are "
                             "in, else the last run), then paths relative to "
                             "the run's workdir")
    parser.add_argument("--run", help="run id or a unique prefix (default: the last run of "
                                         "the code directory you are in, else the last run)")
    parser.add_argument("--to", default=".", metavar="DIR",
                        help="where to put them (default: the current directory)")
    parser.add_argument("--all", action="store_true", dest="every_host",
                        help="from every host of the run, into DIR/<host>/PATH")
    parser.add_argument("--limit", default="100G", metavar="SIZE",
                        help="the most one PATH may hold, by apparent size (default: 100G)")
    return parser


def split_run(words, run):
    """A first word that is a run id (or its prefix of date and time) names the run."""
    from ..run.records import RUN_ID_RE

    first = words[0]
    if run is None and len(words) > 1 and (RUN_ID_RE.match(first) or
                                           (first[:8].isdigit() and first[8:9] == "-")):
        return first, list(words[1:])
    return run, list(words)


def main(args: argparse.Namespace) -> int:
    from ..run.fetch import fetch, parse_size
    from ..views.fetch_view import fetch_lines

    run, paths = split_run(args.paths, args.run)
    results = fetch(paths, run=run, to=args.to, every_host=args.every_host,
                    progress=sys.stderr.isatty(), limit=parse_size(args.limit))
    for line, failed in fetch_lines(results):
        print(line, file=sys.stderr if failed else sys.stdout)
    return 0 if all(r.ok for r in results) else 1
