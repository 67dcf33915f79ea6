"""multihost: run one distributed training job across several machines over SSH.

The public Python API (docs/api.md)::

    import multihost
    cluster = multihost.Cluster.from_ips("10.0.0.1,10.0.0.2")
    run = cluster.run(["train.py"], nproc_per_node=2)
    print(run.wait())
"""
import os
import sys

# `python -m multihost` puts the working directory first on sys.path and imports this
# package before its __main__, and users run multihost from their code directory: a
# training script named like a standard module (json.py, random.py, numbers.py) would be
# imported by the controller in place of the standard one. While `-m` looks for its
# module, sys.argv[0] is "-m"; the installed `multihost` command has no such entry.
if sys.argv[:1] == ["-m"] and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

__version__ = "0.1.0"

# Where each public name lives. A name is imported on first use (PEP 562), so the
# `multihost` command, which imports this package before any of its own modules, pays
# only for what the command it runs uses: `multihost --help` never loads the run engine,
# and a plain `import multihost` stays cheap for tools that only want the errors.
_HOMES = {
    "Cluster": "api", "Run": "api", "RunResult": "api", "Copied": "copy",
    "CheckError": "errors", "CommandTimeout": "errors", "ConfigError": "errors",
    "ConnectError": "errors", "LaunchError": "errors", "MultihostError": "errors",
    "RemoteError": "errors", "RunFailed": "errors", "SyncError": "errors",
    "GpuSample": "events", "LogBlock": "events", "LogLine": "events", "LogProgress": "events",
    "NodeChanged": "events", "NodeState": "events", "RootCause": "events",
    "RunFinished": "events", "RunStarted": "events",
    "Host": "hosts", "load_hosts": "hosts",
}

__all__ = sorted(_HOMES)


def __getattr__(name):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'multihost' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOMES))
