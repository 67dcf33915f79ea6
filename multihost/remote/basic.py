"""Basic facts about a host: who and where the helper runs."""
import os
import platform
import socket
import sys
import time

from .proto import op


@op("basic.hello")
def hello(request):
    return {
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "pid": os.getpid(),
        "home": os.path.expanduser("~"),
        "time": time.time(),
    }
