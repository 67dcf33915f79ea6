"""multihost: run one distributed training job across several machines over SSH.

The public Python API (docs/api.md)::

    import multihost
    cluster = multihost.Cluster.from_ips("10.0.0.1,10.0.0.2")
    run = cluster.run(["train.py"], nproc_per_node=2)
    print(run.wait())

Names are imported on first use, so ``import multihost`` (and every CLI command, which
imports this package first) stays as cheap as it was before the API existed.
"""

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    "Cluster": "api", "Run": "api", "RunResult": "api",
    "Host": "hosts", "load_hosts": "hosts",
    "MultihostError": "errors", "ConfigError": "errors", "ConnectError": "errors",
    "CheckError": "errors", "SyncError": "errors", "LaunchError": "errors",
    "RunFailed": "errors", "RemoteError": "errors", "CommandTimeout": "errors",
    "NodeState": "events", "RunStarted": "events", "NodeChanged": "events",
    "LogLine": "events", "LogBlock": "events", "RunFinished": "events", "RootCause": "events",
    "GpuSample": "events",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'multihost' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
