"""A run of the Python API kept as a job file, and a recorded run started again from
Python (``Cluster.rerun``), as ``multihost rerun`` does from the command line.

Every run keeps its job in its record (``~/.multihost/runs/RUN/job.toml``, docs/jobfile.md):
the CLI writes it from its flags, the API from ``Cluster.run``'s arguments (``job_table``),
so a run started either way can be started again either way. A rerun takes the run's
own hosts (as recorded, with every per-host setting) and how they were reached, its
command (its program's arguments replaced by ``args`` when given), code directory, log
mirror, launcher, environment (secrets given again) and options; the code as it is now.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from .env import MASK, is_secret, mask_argv, mask_url_userinfo

# Cluster.run's arguments that a job file keeps under the same name.
RUN_KEYS = ("data", "gpus", "nproc_per_node", "start_port", "launcher", "no_python", "setup",
            "allow_concurrent", "kill_wait", "wait", "gpu_interval", "name", "queue", "image",
            "engine", "image_from_controller")
PATH_KEYS = ("code", "log_dir")           # kept absolute: a rerun may start elsewhere
NEGATED = {"check": "no_check", "sync": "no_sync"}   # Cluster.run's word -> the file's
SSH_KEYS = {"connect_timeout": "connect_timeout", "accept_new_host_keys": "accept_new_host_keys",
            "ssh_config": "ssh_config", "fanout": "fanout"}  # Cluster's -> the file's


def job_table(command: Sequence[str], options: Mapping[str, Any],
              ssh: Mapping[str, Any]) -> Dict[str, Any]:
    """The job file of a ``Cluster.run``: its arguments in job-file keys, paths absolute,
    secret values masked (given again to rerun it), as ``jobfile.resolved`` does for the CLI."""
    table: Dict[str, Any] = {}
    for key, value in ssh.items():
        if value not in (None, False):
            table[SSH_KEYS[key]] = value
    for key in PATH_KEYS:
        if options.get(key):
            table[key] = os.path.abspath(os.path.expanduser(options[key]))
    for key in RUN_KEYS:
        value = options.get(key)
        if value is None or value is False or value == () or value == "":
            continue
        if key == "data":
            value = [os.path.abspath(os.path.expanduser(p)) for p in value]
        elif key == "gpus" and not isinstance(value, str):
            value = [int(g) for g in value]
        elif key == "launcher" and os.path.isfile(os.path.expanduser(value)):
            value = os.path.abspath(os.path.expanduser(value))
        table[key] = value
    for word, key in NEGATED.items():
        if options.get(word) is False:
            table[key] = True
    env = options.get("env") or {}
    if env:
        table["env"] = {name: MASK if is_secret(name) and value else mask_url_userinfo(str(value))
                        for name, value in env.items()}
    table["command"] = mask_argv(list(command))
    return table


def rerun_plan(run: Optional[str], args: Optional[Sequence[str]], env: Mapping[str, str],
               same_code: bool) -> Tuple[Any, Dict[str, Any], List[str], Dict[str, Any]]:
    """(record, the Cluster's reach options, the command, Cluster.run's arguments) of a
    recorded run to start again; ``args`` replace its program's arguments."""
    from .env import parse_env_file
    from .jobfile import job_to_rerun, load, program_words
    from .records import load_run

    record = load_run(run)
    if (record.ssh or {}).get("transport") == "srun":
        raise ConfigError(f"run {record.run_id} ran on the nodes of Slurm job "
                          f"{record.ssh.get('job_id')}, which are not the API's to take",
                          fix=f"salloc -N {len(record.nodes)} multihost rerun {record.run_id}")
    table = load(str(job_to_rerun(record, list(env), same_code=same_code)))
    command = list(table.get("command") or ())
    if args is not None:
        if isinstance(args, str):
            raise ConfigError("args must be a list of words, e.g. ['--resume', 'ckpt/last.pt']",
                              fix="split it: shlex.split(args)")
        command = program_words(command) + list(args)
    ssh = {mine: table[theirs] for mine, theirs in SSH_KEYS.items() if theirs in table}
    options: Dict[str, Any] = {key: table[key] for key in RUN_KEYS + PATH_KEYS if key in table}
    for word, key in NEGATED.items():
        if table.get(key):
            options[word] = False
    merged: Dict[str, str] = {name: str(value) for name, value in (table.get("env") or {}).items()
                              if MASK not in str(value)}
    for path in table.get("env_file") or ():
        merged.update(parse_env_file(path))      # read again, as the CLI's rerun does
    merged.update(env)
    if merged:
        options["env"] = merged
    return record, ssh, command, options
