"""``multihost completion bash|zsh|fish``: the shell code that turns on Tab completion."""
from __future__ import annotations

import argparse

EPILOG = """\
examples:
  eval "$(multihost completion bash)"           in ~/.bashrc
  multihost completion zsh > ~/.zfunc/_multihost
  register-python-argcomplete multihost         what the bash line prints, from argcomplete

Completes commands, options, run ids (from ~/.multihost/runs), the hosts and ranks of
a run (`logs --host`, `ssh`), and --ips from the hosts of the --hostfile on the line.
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("completion", help="print the shell code for Tab completion",
                            description="Print the shell code that turns on Tab completion.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shell", nargs="?", default="bash", choices=("bash", "zsh", "fish"),
                        help="the shell (default bash)")
    return parser


def main(args: argparse.Namespace) -> int:
    from ..errors import ConfigError

    try:
        import argcomplete
    except ImportError:
        raise ConfigError("shell completion needs the argcomplete package",
                          fix="pip install argcomplete (it comes with multihost)") from None
    print(argcomplete.shellcode(["multihost"], shell=args.shell), end="")
    return 0
