"""``multihost fleetrun``: fleetrun's (and ``python -m paddle.distributed.launch``'s) own
command line, run across the machines.

Every command of PaddlePaddle's docs runs by replacing ``fleetrun`` or ``python -m
paddle.distributed.launch`` with ``multihost fleetrun`` and nothing else: the flags are
spelled as paddle spells them, the script and its arguments follow without ``--``. The
command becomes a ``multihost run`` (check, sync, launch in ip order, dashboard, logs);
parameter-server flags make it a parameter-server job (docs/migrating.md).
"""
from __future__ import annotations

import argparse

from .common import HOST_OPTIONS_HELP, add_host_options, add_job_options
from .run import add_run_options

EPILOG = HOST_OPTIONS_HELP + """
examples (each as in PaddlePaddle's docs, with `multihost fleetrun` in front):
  multihost fleetrun --ips=10.0.0.1,10.0.0.2 --gpus=0,1,2,3 train.py
  multihost fleetrun --log_dir=./log/ --ips=10.0.0.1,10.0.0.2 --gpus "0,1,2,3" tools/train.py -c cfg.yml
  multihost fleetrun --server_num=1 --worker_num=4 train.py           # this machine alone
  multihost fleetrun --servers="10.0.0.1:6170,10.0.0.2:6171" --workers="10.0.0.1,10.0.0.2" train.py
  multihost fleetrun --ips=10.0.0.1,10.0.0.2 --server_num=1 --worker_num=2 train.py   # per machine

multihost's own options (--hostfile, --python, --env, --workdir, --no-sync, --plain, ...)
work here too. --log_dir is where the controller keeps every machine's logs
(DIR/RUN/HOST/log/workerlog.N, serverlog.N); on the machines they are in the run's
directory (`multihost logs` reads both).
"""

# Flags of paddle's launchers with no effect here, and why (said in --help).
ACCEPTED = {
    "--job_id": "the run id names the job",
    "--log_level": "multihost shows every line of every process",
    "--node_ip": "each machine's own address is known from the host list",
    "--use_paddlecloud": "not needed: the machines come from --ips or --hostfile",
}


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "fleetrun", help="fleetrun / paddle.distributed.launch's command line, on every machine",
        description="Run a fleetrun (python -m paddle.distributed.launch) command line "
                    "across the machines: collective or parameter-server.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_host_options(parser)
    add_job_options(parser)
    paddle = parser.add_argument_group("paddle's launcher flags, as paddle spells them")
    paddle.add_argument("--selected_gpus", "--selected_gpu", "--devices", dest="gpus_alias",
                        metavar="LIST", help="the same as --gpus")
    paddle.add_argument("--cluster_node_ips", dest="ips_alias", metavar="A,B,...",
                        help="the same as --ips (paddle 1.x's name)")
    paddle.add_argument("--server_num", type=_count("--server_num"), metavar="N",
                        help="parameter servers (per machine with --ips; else on this one)")
    paddle.add_argument("--worker_num", type=_count("--worker_num"), metavar="N",
                        help="trainers (per machine with --ips; else on this one)")
    paddle.add_argument("--heter_worker_num", metavar="N", help="heterogeneous trainers")
    paddle.add_argument("--servers", metavar="IP:PORT,...",
                        help="parameter servers: the machines are those named in --servers "
                             "and --workers, in order of first appearance")
    paddle.add_argument("--workers", metavar="IP[:PORT],...", help="trainers, one per entry")
    paddle.add_argument("--heter_workers", metavar="IP:PORT,...",
                        help="heterogeneous trainers")
    paddle.add_argument("--http_port", type=_port("--http_port"), metavar="PORT",
                        help="the gloo rendezvous port on the first server's machine "
                             "(default: inside the FLAGS_START_PORT range)")
    for flag, why in ACCEPTED.items():
        kind = {"action": "store_true"} if flag == "--use_paddlecloud" else {"metavar": "X"}
        paddle.add_argument(flag, dest=flag.lstrip("-") + "_ignored", help=f"accepted: {why}",
                            **kind)
    add_run_options(parser, launcher=False)
    parser.add_argument("training_script", metavar="SCRIPT", help="the training script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="its arguments, as typed")
    return parser


def _count(flag: str):
    def parse(text: str) -> int:
        from ..errors import ConfigError

        if not text.strip().isdigit() or not 0 < int(text) <= 1024:
            raise ConfigError(f"{flag} {text!r} is not a number from 1 to 1024",
                              fix=f"e.g. {flag}=2")
        return int(text)
    return parse


def _port(flag: str):
    def parse(text: str) -> int:
        from ..host_parsing import parse_port

        return parse_port(text, flag)
    return parse


def run_args(args: argparse.Namespace, environ=None) -> argparse.Namespace:
    """The ``multihost run`` arguments of a fleetrun command line: its job
    (``run.fleetrun.job_from_fleetrun``) over multihost's own options, kept as given."""
    import os

    from ..run.fleetrun import FleetrunLine, job_from_fleetrun

    line = FleetrunLine(
        script=args.training_script, script_args=tuple(args.training_script_args),
        ips=args.ips, ips_alias=args.ips_alias, gpus=args.gpus, gpus_alias=args.gpus_alias,
        hostfile=args.hostfile, server_num=args.server_num, worker_num=args.worker_num,
        heter_worker_num=args.heter_worker_num, servers=args.servers, workers=args.workers,
        heter_workers=args.heter_workers, http_port=args.http_port)
    job = job_from_fleetrun(line, os.environ if environ is None else environ)
    run = argparse.Namespace(**vars(args))
    run.ips, run.gpus, run.command = job.ips, job.gpus, list(job.command)
    if job.gpus_from:
        run.gpus_from = job.gpus_from
    run.launcher, run.ps, run.no_python = job.launcher, job.ps, False
    return run


def main(args: argparse.Namespace) -> int:
    from . import run

    return run.main(run_args(args))
