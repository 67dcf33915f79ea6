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

from .api import Cluster, Run, RunResult  # noqa: E402 (after the path is made safe)
from .errors import (CheckError, CommandTimeout, ConfigError, ConnectError,  # noqa: E402
                     LaunchError, MultihostError, RemoteError, RunFailed, SyncError)
from .events import (GpuSample, LogBlock, LogLine, LogProgress, NodeChanged,  # noqa: E402
                     NodeState, RootCause, RunFinished, RunStarted)
from .hosts import Host, load_hosts  # noqa: E402

__all__ = ["CheckError", "Cluster", "CommandTimeout", "ConfigError", "ConnectError",
           "GpuSample", "Host", "LaunchError", "LogBlock", "LogLine", "LogProgress",
           "MultihostError", "NodeChanged", "NodeState", "RemoteError", "Run", "RunFailed",
           "RunFinished", "RunResult", "RunStarted", "RootCause", "SyncError", "load_hosts"]
