"""Options every host-facing command shares, and turning them into hosts and a cluster."""
from __future__ import annotations

import argparse
import os
from typing import Tuple

from ..errors import ConfigError
from ..host_parsing import parse_port
from ..hosts import Host, HostOptions, load_inventory, select_hosts

HOST_OPTIONS_HELP = """\
hosts:
  --ips=a,b,c          hosts in node-rank order ([user@]host[:port], [ipv6]:port)
  --hostfile FILE      INI hostfile (see hosts.example.ini), or `NAME slots=N` lines
                       (DeepSpeed, MPI); order = node rank
  neither              this machine alone, without ssh
  --include/--exclude  a subset: names or node sets (10.0.0.[1-4]); order is kept
"""


def _port(text: str) -> int:
    return parse_port(text, "--port")


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--fanout {text!r} is not a number of hosts, 1 or more",
                          fix="e.g. --fanout 64")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"--connect-timeout {text!r} is not a number of seconds above 0",
                          fix="e.g. --connect-timeout 10")
    return value


def add_host_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("hosts and ssh")
    group.add_argument("--ips", metavar="A,B,...",
                       help="comma-separated hosts, in node-rank order (never sorted)")
    group.add_argument("--hostfile", metavar="FILE", help="hostfile (INI); order = node rank")
    group.add_argument("--include", metavar="HOSTS",
                       help="only these hosts: names or node sets like 10.0.0.[1-4] "
                            "(kept in their order; renumbered from node rank 0)")
    group.add_argument("--exclude", metavar="HOSTS",
                       help="leave these hosts out: names or node sets like gpu[3-4]")
    group.add_argument("--user", help="ssh user for every host")
    group.add_argument("--port", type=_port, help="ssh port for every host")
    group.add_argument("-i", "--identity", metavar="FILE", help="ssh private key for every host")
    group.add_argument("--workdir", help="remote working directory for every host")
    group.add_argument("--python", help="python interpreter on the hosts (default python3)")
    group.add_argument("-F", "--ssh-config", metavar="FILE", default="~/.ssh/config",
                       help="ssh client config to read (default ~/.ssh/config)")
    group.add_argument("--accept-new-host-keys", action="store_true",
                       help="record unknown host keys in ~/.ssh/known_hosts "
                            "(like StrictHostKeyChecking=accept-new); changed keys are "
                            "always refused")
    group.add_argument("--connect-timeout", type=_seconds, default=10.0, metavar="S",
                       help="seconds to wait for a host to answer (default 10)")
    group.add_argument("--fanout", type=_count, default=64, metavar="N",
                       help="hosts worked on at once (default 64)")
    group.add_argument("--transport", choices=("ssh", "srun"),
                       help="how commands reach the hosts: srun (steps of the Slurm allocation; "
                            "the default inside one with no --ips/--hostfile) or ssh")


def add_job_file_option(parser: argparse.ArgumentParser) -> None:
    """``-f JOB.toml``: for the commands that start a job (run, scale)."""
    parser.add_argument("-f", "--job-file", metavar="JOB.toml",
                        help="take the job from a TOML file (docs/jobfile.md); flags given "
                             "here beat the file's")


def add_spare_option(parser: argparse.ArgumentParser) -> None:
    """``--spares``: for the commands that check or run a job (check, run, fleetrun)."""
    parser.add_argument("--spares", metavar="HOSTS",
                        help="spare hosts, like --ips or a node set (gpu[5-6]); not part of "
                             "the job: one takes the node rank of a host that fails the "
                             "check or is lost (also: spare = true in the hostfile)")


def hosts_from_args(args: argparse.Namespace) -> Tuple[Host, ...]:
    return inventory_from_args(args)[0]


def inventory_from_args(args: argparse.Namespace) -> Tuple[Tuple[Host, ...], Tuple[Host, ...]]:
    """The job's hosts and the spares (the hostfile's, then --spares'); --include and
    --exclude choose among the job's hosts only."""
    for flag in ("user", "identity", "workdir", "python"):
        value = getattr(args, flag)
        if value is not None and not value.strip():
            name = "-i/--identity" if flag == "identity" else f"--{flag}"
            raise ConfigError(f"{name} is empty", fix=f"give a value or leave {name} out")
    options = HostOptions(user=args.user, port=args.port, identity_file=args.identity,
                          workdir=args.workdir, python=args.python,
                          data=tuple(getattr(args, "data", None) or ()))
    text = getattr(args, "spares", None)
    if text is not None:
        from ..spares import parse_spares   # only then: its records cost every start-up

        listed = parse_spares(text)
    else:
        listed = ()
    slurm = slurm_plan(args)
    hosts, spares = load_inventory(slurm.ips or args.ips, args.hostfile, options, listed)
    if slurm.allocation is not None:
        from ..slurm import with_allocation_gpus

        hosts = with_allocation_gpus(hosts, slurm.allocation, slurm.transport)
    hosts = select_hosts(hosts, getattr(args, "include", None), getattr(args, "exclude", None))
    for host in hosts + spares:
        # ssh would skip a missing key with a warning and then fail to log in: say why now.
        if host.identity_file and not os.path.isfile(os.path.expanduser(host.identity_file)):
            raise ConfigError(f"identity file {host.identity_file} does not exist",
                              host=host.label, fix="give the path of your private key with -i "
                                                   "or the hostfile's identity_file")
    return hosts, spares


def slurm_plan(args: argparse.Namespace):
    """Hosts from a Slurm allocation, and srun or ssh to reach them (slurm/inventory.py);
    worked out once per command."""
    if getattr(args, "_slurm_plan", None) is None:
        from ..slurm import plan

        args._slurm_plan = plan(getattr(args, "transport", None), args.ips, args.hostfile)
    return args._slurm_plan


def cluster_from_args(args: argparse.Namespace, hosts: Tuple[Host, ...] = ()):
    from ..fanout import HostGroup
    from ..slurm import reached_by
    from ..transport import SshOptions
    from ..transport.openssh import persist_seconds
    from ..waits import check_environment

    persist_seconds()  # a bad MULTIHOST_CONTROL_PERSIST is refused before any host is touched
    check_environment()  # and so is a bad MULTIHOST_LOST_AFTER or MULTIHOST_HELPER_START
    options = SshOptions(connect_timeout=args.connect_timeout,
                         accept_new_host_keys=args.accept_new_host_keys,
                         config_file=args.ssh_config)
    return HostGroup(hosts or hosts_from_args(args), reached_by(slurm_plan(args), options),
                     workers=args.fanout)


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """The job's shape, shared by check and run so check checks what run starts."""
    group = parser.add_argument_group("job")
    group.add_argument("--gpus", metavar="LIST",
                       help="devices per host, e.g. 0,1,2,3 (sets CUDA_VISIBLE_DEVICES and "
                            "the processes per node); default: the hostfile's, else CPU")
    group.add_argument("--nproc_per_node", "--nproc-per-node", dest="nproc_per_node",
                       metavar="N", help="processes per host (CPU jobs); default len(--gpus) or 1")
    group.add_argument("--nnodes", metavar="N",
                       help="torchrun's and paddle's flag, taken as typed: it must be the "
                            "number of hosts (multihost starts one node per host)")
    group.add_argument("--start-port", "--start_port", dest="start_port", metavar="N|auto",
                       help="FLAGS_START_PORT for every host (default: the controller's "
                            "FLAGS_START_PORT, else 17000); 'auto' picks a range free on all")
    add_code_options(group)


def add_code_options(group) -> None:
    """What must be identical on every host: check, sync and run (sync takes only these:
    a job's shape means nothing to it)."""
    group.add_argument("--data", action="append", metavar="PATH",
                       help="a dataset that must be identical on every host (repeatable)")
    group.add_argument("--code", metavar="DIR", default=".",
                       help="the code directory to sync to every host's workdir (default .)")


def job_options_from_args(args: argparse.Namespace, hosts: Tuple[Host, ...] = ()):
    """The job of the command line (``job.job_options``); a command without a flag
    leaves its default."""
    from ..job import check_nnodes, job_options

    job = job_options(
        gpus=getattr(args, "gpus", None), nproc_per_node=getattr(args, "nproc_per_node", None),
        start_port=getattr(args, "start_port", None), data=getattr(args, "data", None) or (),
        code=getattr(args, "code", None) or ".",
        gpus_from=getattr(args, "gpus_from", None) or "--gpus",
        image=getattr(args, "image", None), engine=getattr(args, "engine", None),
        image_from_controller=getattr(args, "image_from_controller", False), hosts=hosts)
    if hosts and getattr(args, "nnodes", None) is not None:
        check_nnodes(args.nnodes, hosts)   # a statement about the hosts: refused when wrong
    return job
