"""A run of the Python API kept as a job file, and a recorded run started again from
Python (``Cluster.rerun``), as ``multihost rerun`` does from the command line.

Every run keeps its job in its record (``~/.multihost/runs/RUN/job.toml``, docs/jobfile.md):
the CLI writes it from its flags, the API from ``Cluster.run``'s arguments (``job_table``),
so a run started either way can be started again either way. A rerun takes the run's
own hosts (as recorded, with every per-host setting) and how they were reached, its
command (its program's arguments replaced by ``args`` when given), code directory, log
mirror, launcher, environment (secrets given again), setup and options, and its spares
(its hostfile's ``spare = true`` hosts as the hostfile says today, then the listed ones,
reached with the recorded user, port, key, workdir and python): every key of the job
file, as ``multihost rerun`` reads them (``run -f``); the code as it is now.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..hosts import Host, HostOptions, load_inventory
from .env import MASK, is_secret, mask_argv, mask_url_userinfo

# Cluster.run's arguments that a job file keeps under the same name.
RUN_KEYS = ("data", "gpus", "nproc_per_node", "start_port", "launcher", "no_python", "setup",
            "setup_always", "allow_concurrent", "kill_wait", "wait", "gpu_interval",
            "launch_timeout", "name", "queue", "image", "engine", "image_from_controller")
PATH_KEYS = ("code", "log_dir")           # kept absolute: a rerun may start elsewhere
NEGATED = {"check": "no_check", "sync": "no_sync"}   # Cluster.run's word -> the file's
SSH_KEYS = {"connect_timeout": "connect_timeout", "accept_new_host_keys": "accept_new_host_keys",
            "ssh_config": "ssh_config", "fanout": "fanout"}  # Cluster's -> the file's
HOST_KEYS = {"user": "user", "port": "port", "identity_file": "identity", "workdir": "workdir",
             "python": "python"}   # HostOptions' -> the file's: how spares are reached


def cluster_table(ssh: Mapping[str, Any], host_options: Any, hostfile: Optional[str],
                  spares: Sequence[str]) -> Dict[str, Any]:
    """How a Cluster reaches its hosts, in job-file keys: ``ssh`` (Cluster's names), the
    HostOptions its spares are built with, the hostfile it was read from (its ``spare =
    true`` hosts) and the spares named apart from it (``--spares`` items)."""
    table: Dict[str, Any] = {SSH_KEYS[key]: value for key, value in ssh.items()
                             if value not in (None, False)}
    for field, key in HOST_KEYS.items():
        value = getattr(host_options, field)
        if value is not None:
            table[key] = os.path.abspath(os.path.expanduser(value)) if key == "identity" \
                else value
    if hostfile:
        table["hostfile"] = os.path.abspath(os.path.expanduser(hostfile))
    if spares:
        table["spares"] = list(spares)
    return table


def job_table(command: Sequence[str], options: Mapping[str, Any],
              cluster: Mapping[str, Any]) -> Dict[str, Any]:
    """The job file of a ``Cluster.run``: ``cluster`` (``cluster_table``) and its arguments
    in job-file keys, paths absolute, secret values masked (given again to rerun it), as
    ``jobfile.resolved`` does for the CLI."""
    table: Dict[str, Any] = dict(cluster)
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


@dataclass(frozen=True)
class Again:
    """A recorded run to start again: the Cluster to make (its hosts as the run recorded
    them) and what its ``run`` is given."""

    record: Any                           # the run's RunRecord
    ssh: Dict[str, Any]                   # Cluster's reach keywords
    host_options: HostOptions             # how its spares are reached
    hostfile: Optional[str]               # the hostfile its spares came from, if any
    listed: Tuple[str, ...]               # the spares named apart from the hostfile
    spares: Tuple[Host, ...]              # the hostfile's, then the listed ones
    command: List[str]
    options: Dict[str, Any]               # Cluster.run's keywords


def rerun_plan(run: Optional[str], args: Optional[Sequence[str]], env: Mapping[str, str],
               same_code: bool) -> Again:
    """A recorded run to start again (by id, prefix or name; None: the last one), from its
    job file; ``args`` replace its program's arguments."""
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
    merged = recorded_env(table, env)
    if merged:
        options["env"] = merged
    host_options = HostOptions(**{field: table[key] for field, key in HOST_KEYS.items()
                                  if key in table})
    listed = _items(table.get("spares"))
    return Again(record, ssh, host_options, table.get("hostfile"), tuple(listed),
                 recorded_spares(table, host_options), command, options)


def recorded_env(table: Mapping[str, Any], given: Mapping[str, str]) -> Dict[str, str]:
    """The job's environment as ``run -f`` merges it: its env files read again, then its
    recorded values, then ``given`` (secrets given again), a later value beating an
    earlier one."""
    from .env import parse_env_file

    merged: Dict[str, str] = {}
    for path in _items(table.get("env_file")):
        merged.update(parse_env_file(path))
    merged.update({name: str(value) for name, value in (table.get("env") or {}).items()
                   if MASK not in str(value)})
    merged.update(given)
    return merged


def recorded_spares(table: Mapping[str, Any], options: HostOptions) -> Tuple[Host, ...]:
    """The spares of a job file as ``run -f`` finds them (``load_inventory``, as
    ``commands.common.inventory_from_args``): its hostfile's ``spare = true`` hosts, then
    its ``spares``, built with its host options and data, numbered after its hosts. The
    run's own recorded hosts stand for its ``hosts``, ``hostfile``, ``include`` and
    ``exclude``: these only place the spares."""
    from ..spares import parse_spares

    listed = ",".join(_items(table.get("spares")))
    hosts = ",".join(_items(table.get("hosts"))) or None
    with_data = dataclasses.replace(options, data=tuple(_items(table.get("data"))))
    return load_inventory(hosts, table.get("hostfile"), with_data,
                          parse_spares(listed) if listed else ())[1]


def _items(value: Any) -> List[str]:
    """A job file's list value, which may be written as one string."""
    return [value] if isinstance(value, str) else list(value or ())
