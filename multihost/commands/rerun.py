"""``multihost rerun [RUN]``: start a recorded run again, as it was.

The same hosts (as the run recorded them, with every per-host setting), the same
command, launcher, environment files and options, from the job file every run keeps
in its record (``~/.multihost/runs/RUN/job.toml``); the code as it is now, unless
``--same-code`` refuses a code tree that changed since.
"""
from __future__ import annotations

import argparse

EPILOG = """
examples:
  multihost rerun                       # the last run, again
  multihost rerun 20250101-1200 --same-code
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
    from ..run import jobfile
    from ..cli import build_parser
    from ..errors import ConfigError
    from ..run.records import job_file_path, load_run
    from . import run as run_command

    record = load_run(args.run_id)
    path = job_file_path(record.run_id)
    if not path.is_file():
        raise ConfigError(f"run {record.run_id} has no job file in its record",
                          fix="it was started by an older multihost: run it again with "
                              "`multihost run`")
    table = jobfile.load(str(path))
    given = {item.partition("=")[0] for item in args.env}
    missing = [name for name in jobfile.masked_secrets(table) if name not in given]
    if "command" in missing:
        raise ConfigError(f"run {record.run_id} had a secret in its command line, which is "
                          "never recorded", fix="start it again with `multihost run`, "
                                                "passing the secret through --env NAME")
    if missing:
        raise ConfigError(f"run {record.run_id} had the secret {missing[0]}, which is never "
                          "recorded", fix=f"give it again: multihost rerun {record.run_id} "
                                          f"--env {missing[0]}=...")
    if args.same_code:
        check_same_code(record, table.get("code", "."))
    words = ["run", "-f", str(path)]
    for item in args.env:
        words += ["--env", item]
    words += [flag for flag in ("--detach", "--plain", "--json") if getattr(args, flag[2:])]
    run_args = build_parser("run").parse_args(words)  # the secrets given again come last
    run_args._hosts = record.hosts  # as recorded, not as the hostfile says today
    return run_command.main(run_args)


def check_same_code(record, code: str) -> None:
    from ..errors import ConfigError
    from ..run.setup_step import code_digest
    from ..sync.manifest import code_revision

    commit, dirty = code_revision(code)
    if record.git_commit and commit != record.git_commit:
        raise ConfigError(f"--same-code: {code} is at git revision {str(commit)[:12]}, run "
                          f"{record.run_id} ran {record.git_commit[:12]}",
                          fix=f"`git checkout {record.git_commit[:12]}`, or drop --same-code")
    if record.code_digest and code_digest(code) != record.code_digest:
        raise ConfigError(f"--same-code: the files in {code} changed since run {record.run_id}",
                          fix="restore them (git stash, git checkout), or drop --same-code")
