"""``multihost rerun [RUN] [-- ARGS...]``: start a recorded run again, as it was, or
with new arguments for its program (``-- --resume ckpt/last.pt``).

The same hosts (as the run recorded them, with every per-host setting; a run inside a
Slurm allocation takes the nodes of the allocation it is rerun in), the same
command, launcher, environment files and options, from the job file every run keeps
in its record (``~/.multihost/runs/RUN/job.toml``); the run's own code directory (and log
mirror), wherever rerun is typed; the code as it is now, unless ``--same-code`` refuses a
code tree that changed since.
"""
from __future__ import annotations

import argparse

EPILOG = """
examples:
  multihost rerun                       # the last run, again
  multihost rerun 20250101-1200 --same-code
  multihost rerun bert-large -- --resume ckpt/last.pt   # the same script, new arguments
  multihost rerun --env WANDB_API_KEY=... # a secret: never recorded, give it again

Secrets given with --env were recorded masked; give them again with --env (values
from --env-file files are read again from the files).
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("rerun", help="start a recorded run again, as it was",
                            description="Start a recorded run again: same hosts, same "
                                        "command, the code as it is now.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_id", nargs="?", metavar="RUN",
                        help="a run id or a unique prefix (default: the last run)")
    parser.add_argument("rest", nargs="*", metavar="-- ARGS",
                        help="after --: new arguments for the run's program (its script, "
                             "or -m module), in place of the recorded ones")
    parser.add_argument("--same-code", action="store_true",
                        help="refuse if the code's git revision or content changed since")
    parser.add_argument("--env", action="append", default=[], metavar="K=V",
                        help="give a secret again (recorded runs keep secrets masked)")
    parser.add_argument("--detach", action="store_true", help="return once every node runs")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--plain", action="store_true", help="plain prefixed lines, no dashboard")
    view.add_argument("--json", action="store_true", help="one JSON event per line")
    return parser


def main(args: argparse.Namespace) -> int:
    from ..cli import build_parser
    from ..errors import ConfigError
    from ..run.jobfile import job_to_rerun
    from ..run.records import load_run
    from . import run as run_command

    new_args = args.rest or None     # cli.split_rest: the words after --
    record = load_run(args.run_id)
    given = [item.partition("=")[0] for item in args.env]
    path = job_to_rerun(record, given, same_code=args.same_code)
    words = ["run", "-f", str(path)]
    for item in args.env:
        words += ["--env", item]
    words += [flag for flag in ("--detach", "--plain", "--json") if getattr(args, flag[2:])]
    if new_args is not None:
        from ..run.jobfile import load, program_words

        words += ["--", *program_words(load(str(path)).get("command") or ()), *new_args]
    run_args = build_parser("run").parse_args(words)  # the secrets given again come last
    if (record.ssh or {}).get("transport") == "srun":
        # Its nodes were a Slurm allocation's, now gone: a new allocation's are taken.
        from ..slurm import current

        if current() is None:
            raise ConfigError(f"run {record.run_id} ran on the nodes of Slurm job "
                              f"{record.ssh.get('job_id')}: a rerun needs an allocation",
                              fix=f"salloc -N {len(record.nodes)} multihost rerun {record.run_id}")
    else:
        run_args._hosts = record.hosts  # as recorded, not as the hostfile says today
    return run_command.main(run_args)

