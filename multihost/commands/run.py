"""``multihost run``: check, sync, launch in ip order, follow, and exit with the run's status."""
from __future__ import annotations

import argparse
import os
import sys

from .common import (HOST_OPTIONS_HELP, add_host_options, add_job_file_option, add_job_options,
                     add_spare_option)
from .jobargs import keep_words

EPILOG = HOST_OPTIONS_HELP + """
examples:
  multihost run --ips=10.0.0.1,10.0.0.2 --gpus 0,1,2,3 -- train.py -c configs/cfg.yml
  multihost run --hostfile hosts.ini --nproc_per_node 2 -- examples/train_ddp.py --epochs 3
  multihost run --hostfile hosts.ini --launcher paddle --gpus 0,1 -- tools/train.py -c cfg.yml
  multihost run --hostfile hosts.ini --env NCCL_DEBUG=INFO --env-file secrets.env -- train.py
  HF_TOKEN=hf_... multihost run --hostfile hosts.ini --env HF_TOKEN -- train.py
  multihost run --hostfile hosts.ini --detach -- train.py    # then: multihost logs --follow
  multihost run --slurm -N 2 --detach -- train.py    # an sbatch job; status, logs, stop follow it
  multihost run -f job.toml --gpus 0,1       # the job file, with one value changed
  multihost rerun                            # the last run again, as it was

Host k (the k-th of --ips or the hostfile) is node rank k; its first process is global
rank k * nproc_per_node. Everything after -- runs in each host's workdir exactly as
typed (python is put in front unless --no-python). Every process gets the same
FLAGS_START_PORT, MULTIHOST_RUN_ID, MULTIHOST_NODE_RANK, MULTIHOST_NUM_NODES and
MULTIHOST_NODE_IPS, and its launcher's RANK, LOCAL_RANK, WORLD_SIZE, ...

The job runs detached from ssh: Ctrl-C stops it on every host (a second Ctrl-C skips the
--kill-wait grace); a controller that dies leaves it running, for `multihost status`,
`multihost logs --follow` and `multihost stop` from any later shell.
Exit status: the root cause's (a rank's exit code, 128+N for signal N, 255 for a lost
host), 130 after Ctrl-C, 2-5 when it could not start (bad flags, check, sync, launch).
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("run", help="check, sync, launch on every host in ip order, follow",
                            description="Run one distributed job on every host.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_file_option(parser)
    add_host_options(parser)
    add_job_options(parser)
    add_run_options(parser)
    add_slurm_options(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    keep_words(parser)
    return parser


def add_slurm_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("slurm (from outside an allocation; docs/slurm.md)")
    group.add_argument("--slurm", action="store_true",
                       help="ask Slurm for the nodes (salloc), run on them through srun, "
                            "release them at the end; with --detach: an sbatch job")
    group.add_argument("-N", "--nodes", type=int, metavar="N", help="with --slurm: nodes to ask for")
    group.add_argument("--partition", metavar="P", help="with --slurm: the partition")
    group.add_argument("--time", metavar="T", help="with --slurm: the time limit (e.g. 1:00:00)")
    group.add_argument("--gres", metavar="G", help="with --slurm: generic resources (e.g. gpu:8)")


def add_run_options(parser: argparse.ArgumentParser, launcher: bool = True,
                    with_follow: bool = True) -> None:
    """How a job is started, followed and ended: shared with `multihost fleetrun`, and
    (without ``with_follow``: it follows and ends each run itself) with `multihost scale`."""
    group = parser.add_argument_group("launch")
    group.add_argument("--setup", metavar="CMD",
                       help="a shell command run on every host after sync, before launch, "
                            "in the workdir (e.g. 'pip install -r requirements.txt'); "
                            "skipped where it already succeeded on the same code")
    group.add_argument("--setup-always", action="store_true",
                       help="run the setup even where nothing changed since its last success")
    if launcher:
        group.add_argument("--launcher", default=None, metavar="NAME|FILE",
                           help="torchrun, paddle, python, accelerate, or a template file (see "
                                "docs/templates.md); default: the hostfile's launcher, else "
                                "paddle for a script that imports paddle and not torch, "
                                "else torchrun")
        group.add_argument("--no-python", action="store_true",
                           help="run the command as given instead of `python COMMAND` "
                                "(a shell script, a binary)")
    group.add_argument("--env", action="append", default=[], metavar="K=V|K",
                       help="an environment variable for every process (repeatable); "
                            "a bare NAME takes its value from this shell, so a secret "
                            "stays off the command line")
    group.add_argument("--env-file", action="append", default=[], metavar="FILE",
                       help="NAME=value lines for every process (repeatable)")
    group.add_argument("--name", default="", metavar="NAME",
                       help="a name for the run, shown to every user of the hosts and "
                            "accepted wherever a run id is (logs, stop, status)")
    group.add_argument("--queue", action="store_true",
                       help="when another run holds the hosts (or the GPUs asked for), wait "
                            "for them in line instead of refusing (docs/sharing.md)")
    group.add_argument("--image", default=None, metavar="IMAGE",
                       help="run every node's launcher and ranks inside this container "
                            "image, with the host's network, IPC and GPUs "
                            "(docs/containers.md)")
    group.add_argument("--engine", default=None, choices=("podman", "docker"),
                       help="with --image: the hosts' container engine (default: podman "
                            "where installed, else docker)")
    group.add_argument("--image-from-controller", action="store_true",
                       help="with --image: send the image from this machine (save | load) "
                            "instead of the hosts pulling it")
    group.add_argument("--no-check", action="store_true", help="skip the preflight checks")
    group.add_argument("--no-sync", action="store_true", help="skip the code sync")
    group.add_argument("--allow-concurrent", action="store_true",
                       help="start even if another multihost run holds a host")
    group.add_argument("--log_dir", "--log-dir", dest="log_dir", default="log", metavar="DIR",
                       help="where the controller mirrors every rank's log: DIR/RUN/HOST/ "
                            "(default ./log)")
    if not with_follow:
        return
    add_spare_option(group)   # spares replace a lost host of a followed run only
    follow = parser.add_argument_group("follow and end")
    follow.add_argument("--detach", action="store_true",
                        help="return as soon as every node runs (the run goes on)")
    follow.add_argument("--kill-wait", type=float, default=10.0, metavar="S",
                        help="grace between SIGTERM and SIGKILL when the run is ended "
                             "(default 10)")
    follow.add_argument("--launch-timeout", type=float, default=120.0, metavar="S",
                        help="a node whose job has not started on every node S seconds "
                             "after it was prepared (the controller was lost during the "
                             "launch) stops its ranks itself (default 120)")
    follow.add_argument("--wait", type=float, default=None, metavar="S",
                        help="end the run S seconds after its first rank exits (like srun -W)")
    follow.add_argument("--max-restarts", type=int, default=None, metavar="N",
                        help="after a failure, stop every host, check again and launch "
                             "again under the same run id, up to N times; each process "
                             "gets MULTIHOST_RESTART_COUNT (default 0: no restart; with "
                             "spares, one restart per spare, for a lost host only)")
    follow.add_argument("--hang-timeout", type=float, default=None, metavar="S",
                        help="when no rank has written a line for S seconds, the run is "
                             "hung: take every rank's stack, then stop it (a restart "
                             "follows under --max-restarts)")
    follow.add_argument("--gpu-interval", type=float, default=5.0, metavar="S",
                        help="every host with nvidia-smi samples the run's GPUs every S "
                             "seconds into gpu.log, shown in the dashboard (default 5; "
                             "0: no samples)")
    view = follow.add_mutually_exclusive_group()
    view.add_argument("--plain", action="store_true", help="plain prefixed lines, no dashboard")
    view.add_argument("--json", action="store_true", help="one JSON event per line")
    follow.add_argument("--ranks", action="store_true", help="dashboard: one row per rank")


def script_words(words):
    """Everything after ``--``, verbatim (argparse keeps the ``--`` in REMAINDER)."""
    from ..errors import ConfigError

    words = list(words)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise ConfigError("no script given",
                          fix="write it after --, e.g. multihost run --ips=a,b -- train.py -c cfg.yml")
    return words


def user_env(args, gpus_given: bool):
    from ..run.env import check_user_env, parse_env_file, parse_env_flag

    env = {}
    for path in args.env_file:
        env.update(check_user_env(parse_env_file(path), path, gpus_given))
    pairs = [parse_env_flag(text, os.environ) for text in args.env]
    env.update(check_user_env(pairs, "--env", gpus_given))
    return env


def note_secrets_in_argv(args) -> None:
    """A secret's value on our command line is in `ps` for the whole run: say so once,
    with the way around it (after the input is known good: a refusal stays one line)."""
    from ..run.env import is_secret

    for text in args.env:
        name = text.partition("=")[0].strip()
        if "=" in text and is_secret(name):
            _say(args, f"note: --env {name}=... can be read by any user of this machine in "
                       f"`ps` while the run lasts; `--env {name}` takes it from your "
                       "environment instead")


def save_job(args, record, command) -> None:
    """The resolved job, as a job file in the run's record (for `multihost rerun`)."""
    from ..run import jobfile
    from ..run.records import save_job_file
    from .jobargs import defaults

    save_job_file(record.run_id, jobfile.dump(jobfile.resolved(vars(args), defaults(args),
                                                                   list(command))))


def request_from_args(args: argparse.Namespace, command, job, env, spares=()):
    from ..run.request import RunRequest
    from ..registry.entry import check_name

    return RunRequest(
        command=tuple(command), job=job, launcher=args.launcher, no_python=args.no_python,
        env=env, check=not args.no_check, sync=not args.no_sync,
        allow_concurrent=args.allow_concurrent, log_dir=args.log_dir, kill_wait=args.kill_wait,
        wait=args.wait, detach=args.detach, setup=args.setup, setup_always=args.setup_always,
        max_restarts=args.max_restarts, hang_timeout=args.hang_timeout,
        gpu_interval=getattr(args, "gpu_interval", 5.0), ps=getattr(args, "ps", None),
        spares=spares, launch_timeout=getattr(args, "launch_timeout", 120.0),
        name=check_name(getattr(args, "name", "") or ""), queue=getattr(args, "queue", False),
        image=getattr(args, "image", None), engine=getattr(args, "engine", None),
        image_from_controller=getattr(args, "image_from_controller", False))


def main(args: argparse.Namespace) -> int:
    if getattr(args, "slurm", False):
        from ..errors import ConfigError
        from ..slurm.submit import Ask, in_allocation

        if not args.nodes:
            raise ConfigError("--slurm needs the number of nodes", fix="--slurm -N 2")
        ask = Ask(args.nodes, args.partition, args.time, args.gres)
        if args.detach:  # a detached run is Slurm's to keep: a batch job
            from .run_batch import submit

            script_words(args.command)  # refused here, not in the job's output later
            return submit(args, ask)
        with in_allocation(ask, lambda text: _say(args, text)):   # the run takes its nodes
            return _main(args)
    return _main(args)


def _main(args: argparse.Namespace) -> int:
    from ..run.begin import begin
    from ..views.sync_view import SyncView
    from .common import cluster_from_args
    from .jobargs import with_job_file

    args = with_job_file(args)
    hosts, request, validated = parse_request(args)
    if request.queue and request.detach:   # in line in a process of its own
        from ..registry.queue import wait_in_background

        if wait_in_background(request.name, lambda text: _say(args, text)):
            return 0
    sync_view = SyncView(sys.stderr) if request.sync and not args.json else None
    with cluster_from_args(args, hosts) as cluster, \
            begin(cluster, request, validated, lambda text: _say(args, text),
                  sync_view=sync_view) as life:
        save_job(args, life.record, request.command)
        holder: dict = {}
        outcome = life.run_to_end(lambda: run_view(args, holder), holder)
        return end_of_run(outcome, life.plan, args)


def parse_request(args: argparse.Namespace):
    """(hosts, RunRequest, Validated): the command line as the run's one typed request,
    every mistake in it found before a host is asked."""
    from ..run import request as run_request
    from .common import inventory_from_args, job_options_from_args

    command = script_words(args.command)
    hosts, spares = inventory_from_args(args)
    hosts = getattr(args, "_hosts", None) or hosts  # rerun: the run's own
    job = job_options_from_args(args, hosts)
    env = user_env(args, gpus_given=any(job.gpus_for(h) for h in hosts))
    request = request_from_args(args, command, job, env, spares)
    validated = run_request.validate(hosts, request)  # every mistake, before any host is asked
    note_secrets_in_argv(args)
    if not args.launcher:  # the input is good: say the choice before anything starts
        _say(args, validated.choice.line())
    return hosts, request, validated


def _say(args, text: str) -> None:
    if not args.json:
        print(f"multihost: {text}", file=sys.stderr, flush=True)


def run_view(args, holder):
    """The view of one attempt: the dashboard (its [s] and [d] keys act through the
    attempt's Controls in ``holder``), plain lines, or JSON events."""
    from ..views import make_view

    mode = "json" if args.json else "plain" if args.plain or args.detach else "auto"
    if mode != "auto":
        return make_view(mode)
    return make_view(mode, on_stop=lambda: holder["controls"].stop(),
                     on_detach=lambda: holder["controls"].detach(), by_rank=args.ranks)


def end_of_run(outcome, plan, args) -> int:
    """The exit status of the run, or the one-line error that names its root cause."""
    from ..run.request import failure_of

    if outcome.detached:
        if args.json:
            return 0
        print(f"run {plan.run_id} is running on {len(plan.nodes)} host(s); from any shell:\n"
              f"  multihost status {plan.run_id}\n"
              f"  multihost logs {plan.run_id} --follow\n"
              f"  multihost stop {plan.run_id}")
        return 0
    error = failure_of(outcome, plan)
    if error is not None:
        raise error
    return 0
