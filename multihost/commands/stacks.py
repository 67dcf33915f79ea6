"""``multihost stacks [RUN]``: every rank's Python stack, identical ones grouped."""
from __future__ import annotations

import argparse

from .status import add_connection_options

EPILOG = """\
examples:
  multihost stacks                        the last run: which rank is stuck where?
  multihost stacks 20261121-101500-3f2a --json

Every host is asked at once; a rank's stack comes from py-spy where the host has it,
else from the stack hook multihost puts into every rank (faulthandler). Identical stacks
are shown once with their rank list, the biggest group first: the odd rank out is last.
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("stacks", help="the Python stack of every rank of a running job",
                            description="Show every rank's Python stack, grouped.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", help="run id or a unique prefix (default: the last run)")
    parser.add_argument("--json", action="store_true", help="the groups and every rank as JSON")
    add_connection_options(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    import json

    from ..run.records import load_run
    from ..run.stacks import collect, group_stacks, render, to_json
    from .status import cluster_for

    record = load_run(args.run)
    if record.finished:
        raise ended(record.run_id, str(record.state))
    with cluster_for(record, args) as cluster:
        samples = collect(cluster, record)
    if samples and all(s.error == "not running" for s in samples):
        raise ended(record.run_id, "no rank is running any more")   # its controller was gone
    groups = group_stacks(samples)
    if args.json:
        print(json.dumps(to_json(groups, samples), indent=1))
    else:
        print(render(groups), end="")
    return 0 if any(s.stack for s in samples) else 1


def ended(run_id: str, how: str):
    from ..errors import MultihostError

    return MultihostError(f"run {run_id} has ended ({how}); stacks are only for a running run",
                          fix=f"see how it ended: multihost status {run_id}; its last lines: "
                              f"multihost logs {run_id}")
