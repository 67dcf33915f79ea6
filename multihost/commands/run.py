"""``multihost run``: check, sync, launch in ip order, follow, and exit with the run's status."""
from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import time

from .common import HOST_OPTIONS_HELP, add_host_options, add_job_options
from .jobargs import keep_words

EPILOG = HOST_OPTIONS_HELP + """
examples:
  multihost run --ips=10.0.0.1,10.0.0.2 --gpus 0,1,2,3 -- train.py -c configs/cfg.yml
  multihost run --hostfile hosts.ini --nproc_per_node 2 -- examples/train_ddp.py --epochs 3
  multihost run --hostfile hosts.ini --launcher paddle --gpus 0,1 -- tools/train.py -c cfg.yml
  multihost run --hostfile hosts.ini --env NCCL_DEBUG=INFO --env-file secrets.env -- train.py
  HF_TOKEN=hf_... multihost run --hostfile hosts.ini --env HF_TOKEN -- train.py
  multihost run --hostfile hosts.ini --detach -- train.py    # then: multihost logs --follow
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
    parser.add_argument("-f", "--job-file", metavar="JOB.toml",
                        help="take the job from a TOML file (docs/jobfile.md); flags given "
                             "here beat the file's")
    add_host_options(parser)
    add_job_options(parser)
    add_run_options(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    keep_words(parser)
    return parser


def add_run_options(parser: argparse.ArgumentParser, launcher: bool = True) -> None:
    """How a job is started, followed and ended: shared with `multihost fleetrun`."""
    group = parser.add_argument_group("launch")
    group.add_argument("--setup", metavar="CMD",
                       help="a shell command run on every host after sync, before launch, "
                            "in the workdir (e.g. 'pip install -r requirements.txt'); "
                            "skipped where it already succeeded on the same code")
    group.add_argument("--setup-always", action="store_true",
                       help="run the setup even where nothing changed since its last success")
    if launcher:
        group.add_argument("--launcher", default=None, metavar="NAME|FILE",
                           help="torchrun, paddle, python, or a template file (see "
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
    group.add_argument("--no-check", action="store_true", help="skip the preflight checks")
    group.add_argument("--no-sync", action="store_true", help="skip the code sync")
    group.add_argument("--allow-concurrent", action="store_true",
                       help="start even if another multihost run holds a host")
    group.add_argument("--log_dir", "--log-dir", dest="log_dir", default="log", metavar="DIR",
                       help="where the controller mirrors every rank's log: DIR/RUN/HOST/ "
                            "(default ./log)")
    follow = parser.add_argument_group("follow and end")
    follow.add_argument("--detach", action="store_true",
                        help="return as soon as every node runs (the run goes on)")
    follow.add_argument("--kill-wait", type=float, default=10.0, metavar="S",
                        help="grace between SIGTERM and SIGKILL when the run is ended "
                             "(default 10)")
    follow.add_argument("--wait", type=float, default=None, metavar="S",
                        help="end the run S seconds after its first rank exits (like srun -W)")
    follow.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="after a failure, stop every host, check again and launch "
                             "again under the same run id, up to N times; each process "
                             "gets MULTIHOST_RESTART_COUNT (default 0: no restart)")
    follow.add_argument("--hang-timeout", type=float, default=None, metavar="S",
                        help="when no rank has written a line for S seconds, the run is "
                             "hung: take every rank's stack, then stop it (a restart "
                             "follows under --max-restarts)")
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


def check_log_dir(text: str) -> None:
    """--log_dir must be a directory this controller can create and write, known before
    anything starts: found after the launch, it left the job running unwatched."""
    import errno

    from ..errors import ConfigError

    path = os.path.abspath(os.path.expanduser(text))
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    fix = "give a directory you can write, e.g. --log_dir ./log"
    if not os.path.isdir(existing):
        where = "is" if existing == path else f"is inside {existing}, which is"
        raise ConfigError(f"--log_dir {text} {where} not a directory", fix=fix)
    problem = None
    if not os.access(existing, os.W_OK | os.X_OK):
        problem = os.strerror(errno.EACCES)
    elif os.statvfs(existing).f_flag & os.ST_RDONLY:
        problem = os.strerror(errno.EROFS)
    if problem:
        place = "" if existing == path else f" (in {existing})"
        raise ConfigError(f"--log_dir {text} cannot be written{place}: {problem}", fix=fix)


def _say(args, text: str) -> None:
    if not args.json:
        print(f"multihost: {text}", file=sys.stderr, flush=True)


def preflight(cluster, job, args):
    """The checks of `multihost check`; a failure stops here, before anything starts."""
    from ..check.preflight import run_checks
    from ..check.report import FAIL
    from ..errors import CheckError

    _say(args, f"checking {len(cluster.hosts)} host(s)...")
    report = run_checks(cluster, job)
    failures = [(h, r) for h, r in report.failures(FAIL)
                if not (args.allow_concurrent and r.name == "leftovers")]
    for host, result in failures[1:]:
        fix = f" (fix: {result.fix})" if result.fix else ""
        print(f"multihost: {host.host.label}: {result.name}: {result.detail}{fix}",
              file=sys.stderr)
    if failures:
        host, result = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise CheckError(f"{result.name}: {result.detail}{more}", host=host.host.label,
                         fix=result.fix)
    if report.start_port is None:
        raise report.error()
    return report


def sync(cluster, job, args, data_checked: bool):
    from ..views.sync_view import SyncView

    paths = tuple(dict.fromkeys(tuple(job.data) + tuple(p for h in cluster.hosts for p in h.data)))
    if args.no_sync and (data_checked or not paths):
        return  # nothing to do: do not even import the sync engine
    from ..sync import pipeline as sync_module

    workdirs = {host.rank: _workdir(host, job) for host in cluster.hosts}
    if not args.no_sync:
        _say(args, f"syncing {os.path.abspath(job.code)} to {len(cluster.hosts)} host(s)...")
        view = None if args.json else SyncView(sys.stderr)
        report = sync_module.sync_code(cluster, job.code, workdirs=workdirs, listener=view)
        if view is not None:
            view.show_sync(report)
    if paths and not data_checked:  # the preflight verifies the data itself
        _say(args, f"verifying {len(paths)} dataset(s) on {len(cluster.hosts)} host(s)...")
        from ..data.verify import data_error, verify_data

        report = verify_data(cluster, paths, workdirs=workdirs)
        if not report.ok:
            raise data_error(report)


def setup(cluster, job, args):
    """The setup step on every host (skipped where unchanged); the code tree's content
    hash, which keys it and is recorded for `rerun --same-code`."""
    from ..run import setup_step

    digest = setup_step.code_digest(job.code)
    if not args.setup:
        return digest
    _say(args, f"setup on {len(cluster.hosts)} host(s): {args.setup}")
    write = (lambda line: None) if args.json else \
        (lambda line: print(f"multihost: {line}", file=sys.stderr, flush=True))
    workdirs = {host.rank: _workdir(host, job) for host in cluster.hosts}
    setup_step.run_setup(cluster, args.setup, digest, workdirs, always=args.setup_always,
                         on_result=lambda result: setup_step.show(result, write))
    return digest


def save_job(args, record, command) -> None:
    """The resolved job, as a job file in the run's record (for `multihost rerun`)."""
    from ..run import jobfile
    from ..run.records import save_job_file
    from .jobargs import defaults

    save_job_file(record.run_id, jobfile.dump(jobfile.resolved(args, defaults(args), command)))


def _workdir(host, job):
    from ..job import workdir_for

    return workdir_for(host, job.code)


def in_background(function, *args):
    """Start ``function(*args)`` in a thread; call the result to wait for its value. The
    git revision is worth recording, not worth waiting for while hosts are contacted."""
    import threading

    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", function(*args)),
                              daemon=True)
    thread.start()
    return lambda: (thread.join(), box.get("value"))[1]


def code_revision(code_dir):
    try:
        from ..sync.manifest import code_revision as revision
    except ImportError:
        return None, None
    try:
        return revision(code_dir)
    except Exception:  # a revision is nice to record, never a reason to fail
        return None, None



def initial_record(plan, args, cluster, git):
    from ..run.env import mask_argv
    from ..run.records import NodeRecord, RunRecord, host_to_dict

    nodes = tuple(NodeRecord(n.node_rank, host_to_dict(n.host), n.host.label, n.address,
                             n.nproc, n.rank_offset, n.workdir) for n in plan.nodes)
    options = cluster.options
    return RunRecord(
        run_id=plan.run_id, created=time.time(), nodes=nodes,
        command=tuple(mask_argv(plan.command, plan.user_env)),
        launcher=plan.template.name, node0_argv="", start_port=plan.start_port,
        world_size=plan.world_size, git_commit=git[0], git_dirty=git[1],
        log_dir=os.path.join(os.path.abspath(args.log_dir), plan.run_id),
        kill_wait=plan.kill_wait, allow_concurrent=plan.allow_concurrent,
        ssh={"connect_timeout": options.connect_timeout,
             "accept_new_host_keys": options.accept_new_host_keys,
             "config_file": options.config_file},
        controller={"hostname": socket.gethostname(), "pid": os.getpid(), "cwd": os.getcwd()})


def ps_layout(args, addresses, start_port):
    """A parameter-server job's layout (`multihost fleetrun` only), for these addresses
    and this start port; None for any other job."""
    spec = getattr(args, "ps", None)
    if spec is None:
        return None
    from ..run.fleetrun import build_layout

    return build_layout(spec, addresses, start_port)


def launcher_for(args, hosts, command, code_dir):
    """--launcher, else the hostfile's, else the framework the script imports."""
    from ..run.launcher_choice import choose_launcher

    return choose_launcher(command, code_dir, no_python=args.no_python, given=args.launcher,
                           hostfile=hosts[0].launcher if hosts else None)


def main(args: argparse.Namespace) -> int:
    from ..run import launchers as launch
    from ..run import plan as run_plan
    from ..errors import ConfigError
    from ..job import job_options_from_args
    from ..run.records import new_run_id
    from .common import cluster_from_args, hosts_from_args

    from .jobargs import with_job_file

    args = with_job_file(args)
    command = script_words(args.command)
    hosts = getattr(args, "_hosts", None) or hosts_from_args(args)  # rerun: the run's own
    job = job_options_from_args(args, hosts)
    choice = launcher_for(args, hosts, command, job.code)
    template = launch.load_template(choice.name)
    # The preflight checks that every host has what the launcher imports (torchrun: torch).
    job = dataclasses.replace(job, frameworks=template.frameworks)
    ps = ps_layout(args, [h.name for h in hosts], job.start_port or 17000)
    if ps is not None:  # the check then checks every role's port on every machine
        job = dataclasses.replace(job, nproc_per_node=ps.ports_per_machine())
    env = user_env(args, gpus_given=any(job.gpus_for(h) for h in hosts))
    check_log_dir(args.log_dir)
    if args.kill_wait < 0 or (args.wait is not None and args.wait < 0):
        raise ConfigError("--kill-wait and --wait take seconds, 0 or more", fix="e.g. --kill-wait 10")
    check_restart_options(args)
    # Every mistake in the input is found now, not after a long check and sync.
    run_plan.build_plan("", hosts, job, template, command, start_port=job.start_port or 0,
                        addresses=[h.name for h in hosts], no_python=args.no_python, ps=ps)
    if not args.no_sync:
        run_plan.check_script(command, job.code, no_python=args.no_python)
    note_secrets_in_argv(args)
    if not args.launcher:  # the input is good: say the choice before anything starts
        _say(args, choice.line())
    revision = in_background(code_revision, job.code)
    with cluster_from_args(args, hosts) as cluster:
        report = None if args.no_check else preflight(cluster, job, args)
        start_port = report.start_port if report else job.start_port
        if start_port is None:
            raise ConfigError("--start-port auto needs the preflight to find a free port",
                              fix="drop --no-check, or give a port: --start-port 17000")
        sync(cluster, job, args, data_checked=report is not None)
        digest = setup(cluster, job, args)
        addresses = [(report.host_report(h).address if report and report.host_report(h) else None)
                     or run_plan.resolve_address(h, cluster.options.config_file) for h in hosts]
        ifaces = [report.iface_for(h) if report else None for h in hosts]
        plan = run_plan.build_plan(
            new_run_id(), hosts, job, template, command, start_port=start_port,
            addresses=addresses, ifaces=ifaces, no_python=args.no_python, environ=os.environ,
            user_env=env, kill_wait=args.kill_wait, allow_concurrent=args.allow_concurrent,
            ps=ps_layout(args, addresses, start_port))
        record = initial_record(plan, args, cluster, revision() or (None, None))
        record = dataclasses.replace(record, code_digest=digest)
        save_job(args, record, command)
        if not args.max_restarts:
            return follow_run(cluster, plan, record, args)
        from .run_again import run_attempts

        return run_attempts(cluster, job, plan, record, args)


def follow_run(cluster, plan, record, args) -> int:
    return end_of_run(follow_once(cluster, plan, record, args), plan, args)


def follow_once(cluster, plan, record, args):
    from ..run.follow import RunOptions, start_and_follow
    from ..views import make_view

    mode = "json" if args.json else "plain" if args.plain or args.detach else "auto"
    holder = {}
    view = make_view(mode, on_stop=lambda: holder["controls"].stop(),
                     on_detach=lambda: holder["controls"].detach(),
                     by_rank=args.ranks) if mode == "auto" else make_view(mode)
    options = RunOptions(detach=args.detach, wait_after_exit=args.wait,
                         hang_timeout=args.hang_timeout)
    try:
        outcome = start_and_follow(cluster, plan, record, view, options, holder)
    finally:  # the dashboard gives the terminal back before anything else is printed
        getattr(view, "close", lambda: None)()
    return dataclasses.replace(outcome, stop_reason=holder["controls"].interrupts.reason or "")


def end_of_run(outcome, plan, args) -> int:
    """The exit status of the run, or the one-line error that names its root cause."""
    from ..errors import RunFailed
    from ..run.follow import STOP_FROM_DASHBOARD
    from ..run.outcome import describe

    if outcome.detached:
        if args.json:
            return 0
        print(f"run {plan.run_id} is running on {len(plan.nodes)} host(s); from any shell:\n"
              f"  multihost status {plan.run_id}\n"
              f"  multihost logs {plan.run_id} --follow\n"
              f"  multihost stop {plan.run_id}")
        return 0
    result = outcome.result
    if result.exit_code == 0:
        return 0
    lost = "".join(f"; {plan.nodes[r].host.label} was lost: its processes may still run "
                   f"(`multihost stop {plan.run_id}` when it is back)" for r in result.lost)
    if result.root_cause is not None:
        cause = result.root_cause
        raise RunFailed(f"run {plan.run_id} failed: {describe(cause)}{lost}", host=cause.host,
                        fix=fix_for(cause, plan), exit_code=result.exit_code)
    if result.interrupted:
        raise RunFailed(f"run {plan.run_id} stopped on every host (interrupted){lost}",
                        exit_code=result.exit_code)
    if outcome.stop_reason == STOP_FROM_DASHBOARD:
        raise RunFailed(f"run {plan.run_id} stopped on every host (from the dashboard){lost}",
                        exit_code=result.exit_code)
    raise RunFailed(f"run {plan.run_id} was stopped{lost}", exit_code=result.exit_code,
                    fix=f"see `multihost status {plan.run_id}`")


def check_restart_options(args) -> None:
    from ..errors import ConfigError

    if args.hang_timeout is not None and args.hang_timeout <= 0:
        raise ConfigError("--hang-timeout takes seconds, more than 0", fix="e.g. --hang-timeout 600")
    if args.max_restarts < 0:
        raise ConfigError("--max-restarts takes a count, 0 or more", fix="e.g. --max-restarts 3")
    if args.max_restarts and args.detach:
        raise ConfigError("--max-restarts needs this controller to follow the run, and "
                          "--detach leaves it", fix="drop --detach (or --max-restarts)")


def fix_for(cause, plan) -> str:
    """What to look at next, for the root cause's kind of failure."""
    import signal

    node = plan.nodes[cause.node_rank]
    if cause.kind == "lost":
        return (f"check that {node.host.label} is up and reachable; then "
                f"`multihost stop {plan.run_id}` to clean up what may still run there")
    if cause.kind == "hang":
        return "every rank's stack was taken when it hung (the path above); look for the rank apart"
    if cause.kind == "wait":
        return "the other ranks did not finish in time: look for a hang in their logs"
    if cause.signal == signal.SIGKILL or cause.exit_code == 137:
        return (f"look for the OOM killer in `dmesg` on {node.host.label}; lower the batch "
                "size or the number of data-loader workers")
    if cause.local_rank is not None:
        return (f"read its log: multihost logs {plan.run_id} --rank {cause.rank} "
                f"(on the host: ~/.multihost/runs/{plan.run_id}/log/workerlog.{cause.local_rank})")
    return f"read the launcher's output: multihost logs {plan.run_id} --host {node.host.label}"
