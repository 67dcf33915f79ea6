"""`multihost lab`: real SSH hosts on this machine, made of Linux namespaces (needs root).

Top-level imports stay light (argparse only); the lab is imported inside main.
"""
from __future__ import annotations

import argparse

EPILOG = """\
examples:
  multihost lab up 4                       h1..h4 at 198.18.0.11..14, each with its own sshd
  multihost lab up 2 --name slow --rate 1gbit
                                           a second lab beside it, 1 Gbit/s links
  multihost lab status                     hosts, init pids, sshd, links
  multihost lab exec -- ssh 198.18.0.11 hostname
  multihost lab exec -- multihost exec --hostfile /tmp/multihost-lab/mhlab/hosts.ini -- hostname
  multihost lab cut 2                      unplug host 2's cable (heal 2 plugs it back)
  multihost lab shape 3 --rate 200mbit     host 3's link alone slower, both ways
                                           (--clear lifts it)
  multihost lab sshd-stop 3                kill host 3's sshd; its jobs keep running
  multihost lab host 3 -- ps -ef           a command inside host 3 (no ssh)
  multihost lab down                       remove every namespace, process and file

The lab lives in /tmp/multihost-lab/NAME (NAME defaults to mhlab; --dir or
$MULTIHOST_LAB_DIR override it). `lab exec` runs a command as the controller: inside the
lab's controller namespace, with the lab's ssh key, known_hosts and ssh config as ~/.ssh.
Lab traffic never leaves the machine: the root namespace gets no lab address or route.
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="lab name (default mhlab); labs with different names coexist")
    p.add_argument("--dir", help="lab state dir (default /tmp/multihost-lab/NAME, or $MULTIHOST_LAB_DIR)")


def _host(p: argparse.ArgumentParser) -> None:
    p.add_argument("index", type=int, metavar="I", help="host number, 1-based (h1 is 198.18.0.11)")


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "lab", help="a local multi-host lab with real sshd (needs root)",
        description="Real SSH hosts on this one machine, made of Linux namespaces.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="lab_command", metavar="ACTION")
    sub.required = True

    up = sub.add_parser("up", help="bring up N hosts", epilog=EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    up.add_argument("n", type=int, metavar="N", help="number of hosts (1-64)")
    up.add_argument("--rate", help="shape every link with tbf, e.g. 1gbit, 100mbit")
    up.add_argument("--share", action="append", default=[], metavar="PATH",
                    help="also show PATH inside every host at the same path (repeatable)")
    up.add_argument("--replace", action="store_true",
                    help="tear down a lab of the same name first instead of refusing")
    up.add_argument("--shared-home", nargs="?", const="alice", metavar="USER",
                    help="add an ordinary user (default alice) whose home is one directory "
                         "on every host, as NFS homes are; its hostfile is in that home")
    up.add_argument("--sshfs", action="store_true",
                    help="with --shared-home: that home is an sshfs mount on every host, served "
                         "by host 1 (a network filesystem's weak semantics) instead of a bind mount")
    up.add_argument("--containers", action="store_true",
                    help="podman in every host, with its own storage (run --image tests)")
    up.add_argument("--slurm", action="store_true",
                    help="also run Slurm: slurmctld on ctl (198.18.0.1), slurmd on every host")
    sub.add_parser("down", help="remove the lab: processes, namespaces, files")
    sub.add_parser("status", help="one line per host: address, init pid, sshd, link")
    ex = sub.add_parser("exec", help="run a command as the controller (-- CMD...)")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")
    for action, text in [("cut", "unplug host I's cable (both ends down)"),
                         ("heal", "plug host I's cable back in"),
                         ("sshd-stop", "stop host I's sshd only; the host and its jobs live on"),
                         ("sshd-start", "start host I's sshd again")]:
        _host(sub.add_parser(action, help=text))
    shape = sub.add_parser("shape", help="shape host I's link alone, both directions (tbf)")
    _host(shape)
    shape.add_argument("--rate", help="e.g. 200mbit")
    shape.add_argument("--clear", action="store_true", help="lift host I's shaping")
    host = sub.add_parser("host", help="run a command inside host I (-- CMD...), without ssh")
    _host(host)
    host.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")
    for p in sub.choices.values():
        _common(p)
    return parser


def _command(args) -> list:
    """The command after `--`. argparse hands everything after I to the REMAINDER, so
    options written before `--` (`lab host 2 --name x -- ps`) are picked out here."""
    cmd = list(args.cmd)
    if "--" in cmd:
        head, cmd = cmd[:cmd.index("--")], cmd[cmd.index("--") + 1:]
        if head:
            options = argparse.ArgumentParser(prog=f"multihost lab {args.lab_command}")
            _common(options)
            options.parse_args(head, namespace=args)
    if not cmd:
        from ..errors import ConfigError
        raise ConfigError("no command given", fix=f"multihost lab {args.lab_command} -- CMD...")
    return cmd


def _run(argv: list) -> int:
    import subprocess
    rc = subprocess.call(argv)
    return 128 - rc if rc < 0 else rc  # killed by signal N: 128+N, as shells report it


def _print_status(lab) -> None:
    import sys

    from ..views.lab_view import render_status

    render_status(lab.name, str(lab.dir), str(lab.hostfile), lab.status(), lab.slurm_nodes(),
                  sys.stdout)


def main(args) -> int:
    from ..lab import Lab

    action = args.lab_command
    cmd = _command(args) if action in ("exec", "host") else []
    lab = Lab.find(args.name, args.dir)
    if action == "up":
        import time
        t0 = time.monotonic()
        lab.up(args.n, rate=args.rate, shares=args.share, replace=args.replace,
               with_slurm=args.slurm, shared_home=args.shared_home, sshfs=args.sshfs,
               with_containers=args.containers)
        print(f"lab {lab.name}: {args.n} host(s) up{' with Slurm' if args.slurm else ''} "
              f"in {time.monotonic() - t0:.1f}s")
        print(f"  hostfile  {lab.hostfile}")
        if args.shared_home:
            from ..lab.users import SSHFS_HOMES, home_of, shared_dir
            home, files = home_of(lab.paths, args.shared_home), None
            if args.sshfs:
                home = f"{SSHFS_HOMES}/{args.shared_home}"
                files = shared_dir(lab.paths) / "sshfs" / args.shared_home
            print(f"  user      {args.shared_home}, home {home} on every host "
                  f"(hostfile {files or home}/hosts.ini)")
        print(f"  try       multihost lab exec --name {lab.name} -- ssh {lab.address(1)} hostname")
        if args.slurm:
            print(f"  slurm     multihost lab exec --name {lab.name} -- salloc -N {args.n} srun hostname")
    elif action == "down":
        lab.down()
        print(f"lab {lab.name}: down")
    elif action == "status":
        _print_status(lab)
    elif action == "exec":
        return _run(lab.exec_argv(cmd))
    elif action == "host":
        return _run(lab.host_argv(args.index, cmd))
    elif action == "cut":
        lab.cut(args.index)
    elif action == "heal":
        lab.heal(args.index)
    elif action == "shape":
        if bool(args.rate) == bool(args.clear):
            from ..errors import ConfigError
            raise ConfigError("give either --rate R or --clear",
                              fix=f"multihost lab shape {args.index} --rate 200mbit")
        lab.shape(args.index, None if args.clear else args.rate)
    elif action == "sshd-stop":
        lab.sshd_stop(args.index)
    elif action == "sshd-start":
        lab.sshd_start(args.index)
    return 0
