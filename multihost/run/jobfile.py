"""Job files: what a user otherwise types on every ``multihost run``, in TOML.

    hostfile = "hosts.ini"          # or: hosts = ["10.0.0.1", "10.0.0.2"]
    code = "."
    gpus = "0-3"
    setup = "pip install -r requirements.txt"
    command = ["train.py", "-c", "configs/cfg.yml"]
    [env]
    NCCL_DEBUG = "INFO"

A job file becomes the words of the flags it stands for, put before the command line's
own: argparse then checks every value as it checks a flag, and a flag typed on the
command line beats the file's (a repeatable one, --env, --data, adds to it). Relative
paths in the file are relative to the file. ``dump`` writes a resolved job back as TOML:
every run keeps one in its record, for ``multihost rerun``.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from .env import MASK, is_secret, mask_argv, mask_url_userinfo
from .launchers import BUILTIN

# TOML key -> (flag, kind). Kinds: str, path (relative to the file), int, float, bool,
# list (repeatable flag; a string is one item), paths (the same, relative to the file).
KEYS: Dict[str, Tuple[str, str]] = {
    "hosts": ("--ips", "hosts"), "hostfile": ("--hostfile", "path"),
    "include": ("--include", "str"), "exclude": ("--exclude", "str"),
    "spares": ("--spares", "hosts"),
    "user": ("--user", "str"), "port": ("--port", "int"), "identity": ("--identity", "path"),
    "workdir": ("--workdir", "str"), "python": ("--python", "str"),
    "ssh_config": ("--ssh-config", "path"), "connect_timeout": ("--connect-timeout", "float"),
    "fanout": ("--fanout", "int"), "accept_new_host_keys": ("--accept-new-host-keys", "bool"),
    "code": ("--code", "path"), "data": ("--data", "list"), "gpus": ("--gpus", "gpus"),
    "nproc_per_node": ("--nproc_per_node", "int"), "start_port": ("--start-port", "port"),
    "launcher": ("--launcher", "launcher"), "no_python": ("--no-python", "bool"),
    "env": ("--env", "env"), "env_file": ("--env-file", "paths"),
    "setup": ("--setup", "str"), "setup_always": ("--setup-always", "bool"),
    "no_check": ("--no-check", "bool"), "no_sync": ("--no-sync", "bool"),
    "allow_concurrent": ("--allow-concurrent", "bool"), "log_dir": ("--log_dir", "path"),
    "kill_wait": ("--kill-wait", "float"), "wait": ("--wait", "float"),
    "gpu_interval": ("--gpu-interval", "float"), "launch_timeout": ("--launch-timeout", "float"),
    "name": ("--name", "str"), "queue": ("--queue", "bool"),
    "image": ("--image", "str"), "engine": ("--engine", "str"),
    "image_from_controller": ("--image-from-controller", "bool"),
    "command": ("", "command"),
}
# Recorded even at their defaults ("." and "log"): relative to where the run was started,
# so a rerun from another directory must be given them as they were, absolute.
ALWAYS_RECORDED = ("code", "log_dir")
# The argparse destination of each key, for writing a resolved job back.
DESTS = {"hosts": "ips", "identity": "identity", "ssh_config": "ssh_config",
         "nproc_per_node": "nproc_per_node", "log_dir": "log_dir"}


def _toml():
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    import tomli  # the same parser, from PyPI, before 3.11
    return tomli


def load(path: str) -> Dict[str, Any]:
    """The file's table; unreadable, not TOML or an unknown key: one line naming the file."""
    from ..userfiles import read_config_text

    text = read_config_text(Path(path).expanduser(), "job file", "-f").lstrip("\ufeff")
    toml = _toml()
    try:
        table = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}",
                          fix="see docs/jobfile.md for the format, e.g. code = \".\"") from None
    for key in table:
        if key not in KEYS:
            raise ConfigError(f"{path}: unknown key {key!r}",
                              fix=f"known keys are: {', '.join(KEYS)}")
    return table


def to_words(table: Mapping[str, Any], path: str) -> Tuple[List[str], List[str]]:
    """(flag words, command words) that the table stands for."""
    base = os.path.dirname(os.path.abspath(os.path.expanduser(path)))
    words: List[str] = []
    command: List[str] = []
    for key, value in table.items():
        flag, kind = KEYS[key]
        where = f"{path}: {key}"
        if kind == "command":
            command = _command(value, where)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(f"{where} is {value!r}, not true or false",
                                  fix=f"write {key} = true")
            if value:
                words.append(flag)
        elif kind == "env":
            if not isinstance(value, dict) or not all(isinstance(v, (str, int, float))
                                                      and not isinstance(v, bool)
                                                      for v in value.values()):
                raise ConfigError(f"{where} is not a table of NAME = \"value\"",
                                  fix="write [env] then lines like NCCL_DEBUG = \"INFO\"")
            for name, item in value.items():
                words += [flag, f"{name}={item}"]
        elif kind in ("list", "paths"):
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise ConfigError(f"{where} is not a string or a list of strings",
                                  fix=f"write {key} = [\"a\", \"b\"]")
            for item in items:
                words += [flag, _relative(item, base) if kind == "paths" else item]
        else:
            words += [flag, _scalar(key, kind, value, where, base)]
    return words, command


def _scalar(key: str, kind: str, value: Any, where: str, base: str) -> str:
    if kind == "hosts" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    if kind == "gpus" and isinstance(value, list) and all(type(v) is int for v in value):
        return ",".join(str(v) for v in value)
    if kind in ("int", "port") and type(value) is int:
        return str(value)
    if kind == "float" and type(value) in (int, float):
        return str(value)
    if isinstance(value, str) and kind in ("str", "path", "hosts", "gpus", "port", "launcher"):
        if kind == "path":
            return _relative(value, base)
        if kind == "launcher" and value not in BUILTIN:
            return _relative(value, base)  # a template file, next to the job file
        return value
    wanted = {"int": "a number", "float": "a number", "port": "a number or \"auto\"",
              "hosts": "a list of hosts", "gpus": "\"0-3\" or [0, 1, 2, 3]"}.get(kind, "a string")
    raise ConfigError(f"{where} is {value!r}, not {wanted}", fix="see docs/jobfile.md")


def _command(value: Any, where: str) -> List[str]:
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}", fix="close the quote, or write a list: "
                                                     "command = [\"train.py\", \"-c\", \"cfg.yml\"]"
                              ) from None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"{where} is not a command", fix="write command = [\"train.py\", \"--epochs\", \"3\"]")


def _relative(value: str, base: str) -> str:
    expanded = os.path.expanduser(value)
    return expanded if os.path.isabs(expanded) else os.path.normpath(os.path.join(base, expanded))


def resolved(values: Mapping[str, Any], defaults: Mapping[str, Any],
             command: Sequence[str]) -> Dict[str, Any]:
    """The job a run's final flag values stand for (``values`` and ``defaults`` keyed by
    each flag's dest, as argparse names them), in job-file keys, paths absolute and
    secret values masked: what `rerun` starts again and a user can copy as a job file."""
    table: Dict[str, Any] = {}
    for key, (flag, kind) in KEYS.items():
        if kind == "command":
            continue
        dest = DESTS.get(key, flag.lstrip("-").replace("-", "_"))
        value = values.get(dest)
        if value is None or value == [] or value is False or \
                (value == defaults.get(dest) and key not in ALWAYS_RECORDED):
            continue
        if kind == "env":
            # A bare `--env NAME` came from the shell: like a secret, it is given again.
            table[key] = {n: (MASK if not eq or is_secret(n) and v else mask_url_userinfo(v))
                          for n, eq, v in (item.partition("=") for item in value)}
        elif kind in ("path", "paths") or (kind == "launcher" and value not in BUILTIN):
            table[key] = ([os.path.abspath(os.path.expanduser(v)) for v in value]
                          if isinstance(value, list) else os.path.abspath(os.path.expanduser(value)))
        elif kind == "int" and isinstance(value, str) and value.isdigit():
            table[key] = int(value)  # --nproc_per_node is kept as typed
        else:
            table[key] = value
    table["command"] = mask_argv(command)
    return table


def dump(table: Mapping[str, Any]) -> str:
    """TOML for the value types of a job (strings, numbers, booleans, lists, one table).
    A JSON string is a valid TOML basic string."""
    lines, tables = [], []
    for key, value in table.items():
        if isinstance(value, dict):
            tables.append(f"\n[{key}]")
            tables += [f"{json.dumps(n)} = {json.dumps(str(v), ensure_ascii=False)}"
                       for n, v in value.items()]
        else:
            lines.append(f"{key} = {_value(value)}")
    return "\n".join(lines + tables) + "\n"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


def program_words(command: Sequence[str]) -> List[str]:
    """The words of a command that name the program, before its arguments: the script
    (``train.py``), or ``-m module`` / ``-c code``."""
    if len(command) >= 2 and command[0] in ("-m", "-c"):
        return list(command[:2])
    return list(command[:1])


def masked_secrets(table: Mapping[str, Any]) -> List[str]:
    """What was not recorded (secret values, passwords in URLs, values from the shell)
    and must be given again: env names, and "command" for a masked word of the command."""
    missing = [name for name, value in (table.get("env") or {}).items() if MASK in str(value)]
    if any(MASK in str(word) for word in table.get("command") or ()):
        missing.append("command")
    return missing


def job_to_rerun(record, given_env: Sequence[str], *, same_code: bool = False) -> Path:
    """The job file of a recorded run (``multihost rerun``), once every secret it had is
    given again (``given_env``: the names) and, with ``same_code``, the code is the one it
    ran; else the ConfigError that says what to give or restore."""
    from .records import job_file_path

    path = job_file_path(record.run_id)
    if not path.is_file():
        raise ConfigError(f"run {record.run_id} has no job file in its record",
                          fix="it was started by an older multihost: run it again with "
                              "`multihost run`")
    table = load(str(path))
    missing = [name for name in masked_secrets(table) if name not in given_env]
    if "command" in missing:
        raise ConfigError(f"run {record.run_id} had a secret in its command line, which is "
                          "never recorded", fix="start it again with `multihost run`, "
                                                "passing the secret through --env NAME")
    if missing:
        raise ConfigError(f"run {record.run_id} had the secret {missing[0]}, which is never "
                          "recorded", fix=f"give it again: multihost rerun {record.run_id} "
                                          f"--env {missing[0]}=...")
    if same_code:
        check_same_code(record, table.get("code", "."))
    return path


def check_same_code(record, code: str) -> None:
    """``rerun --same-code``: the code's git revision and content as the run recorded them."""
    from ..sync.manifest import code_revision
    from .setup_step import code_digest

    commit, _ = code_revision(code)
    if record.git_commit and commit != record.git_commit:
        raise ConfigError(f"--same-code: {code} is at git revision {str(commit)[:12]}, run "
                          f"{record.run_id} ran {record.git_commit[:12]}",
                          fix=f"`git checkout {record.git_commit[:12]}`, or drop --same-code")
    if record.code_digest and code_digest(code) != record.code_digest:
        raise ConfigError(f"--same-code: the files in {code} changed since run {record.run_id}",
                          fix="restore them (git stash, git checkout), or drop --same-code")


def last_run_from(code_dir: str, look: int = 200) -> Optional[str]:
    """The newest run whose code directory (its job file's ``code``) is ``code_dir``:
    where a project's outputs are, when several projects share the hosts; None if none
    of the newest ``look`` runs is."""
    from .records import job_file_path, run_ids

    wanted = os.path.realpath(code_dir)
    for run_id in list(reversed(run_ids()))[:look]:
        try:
            code = load(str(job_file_path(run_id))).get("code")
        except ConfigError:
            continue
        if isinstance(code, str) and os.path.realpath(code) == wanted:
            return run_id
    return None
