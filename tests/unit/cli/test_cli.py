"""The command as a user meets it: help with examples, version, one-line errors."""
import subprocess
import sys

import pytest

from multihost.cli import COMMANDS, build_parser


def multihost(*args, **kw):
    return subprocess.run([sys.executable, "-m", "multihost", *args], capture_output=True,
                          text=True, timeout=60, **kw)


def test_version():
    done = multihost("--version")
    assert done.returncode == 0 and done.stdout.startswith("multihost ")


def registered():
    parser = build_parser()
    return [name for name in COMMANDS if name in parser._subparsers._group_actions[0].choices]


@pytest.mark.parametrize("name", ["exec", "lab"])
def test_foundation_commands_exist(name):
    assert name in registered()


@pytest.mark.parametrize("name", registered())
def test_every_command_has_help_with_examples(name):
    done = multihost(name, "--help")
    assert done.returncode == 0
    assert "multihost " + name in done.stdout and "example" in done.stdout.lower()


def test_bad_input_is_one_line_without_traceback():
    done = multihost("exec", "--ips=a,,b", "--", "true")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("multihost: --ips item 2: empty host name")


def test_exec_without_a_command_says_how():
    done = multihost("exec")
    assert done.returncode == 2 and "no command given" in done.stderr


def test_help_lists_every_command_with_the_line_its_own_help_gives():
    done = multihost("--help")
    assert done.returncode == 0
    subparsers = build_parser()._subparsers._group_actions[0]
    own_lines = {action.dest: action.help for action in subparsers._choices_actions}
    assert set(own_lines) == set(COMMANDS)
    listing = " ".join(done.stdout.split())  # argparse wraps long lines
    for name, line in own_lines.items():
        assert f"{name} {line}" in listing, f"{name}: {line!r} not in --help"
