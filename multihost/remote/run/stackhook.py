"""Copied into a run as ``stackhook/sitecustomize.py`` and put on the PYTHONPATH of each
rank by the rank wrapper: in the rank's own Python process (the first one below the
wrapper, not the interpreters it starts), faulthandler dumps every thread's stack to the rank's stacks
file when STACK_SIGNAL comes. ``multihost stacks`` sends it where py-spy is missing.
A marker line says the hook is in: a process without it is never sent the signal (a
real-time signal's default action ends the process).

It also marks the moment the rank begins to exit (an exception or sys.exit reached the
top), in MULTIHOST_EXIT_FILE: before the atexit handlers close its collectives'
connections (paddle's destroys its process groups there), on which its peers fail,
often before this process is gone. The rank wrapper records that moment with the exit.

The sitecustomize this one hides (the distribution's, the user's) is run after it.
"""
import os
import sys


def _install():
    path = os.environ.get("MULTIHOST_STACKS_FILE")
    if not path or os.environ.get("MULTIHOST_STACKS_OWNER"):
        return
    os.environ["MULTIHOST_STACKS_OWNER"] = str(os.getpid())  # its children pass it by
    import faulthandler
    import signal

    out = open(path, "a")            # kept open: faulthandler writes to its descriptor
    out.write("# multihost stack hook pid %d\n" % os.getpid())
    out.flush()
    number = getattr(signal, "SIGRTMIN", 34) + 4
    faulthandler.register(number, file=out, all_threads=True)
    sys._multihost_stacks_file = out  # alive as long as the process
    _mark_exit(os.environ.get("MULTIHOST_EXIT_FILE"), os.getpid())


def _mark_exit(path, owner):
    import threading
    import time

    def mark():
        if os.getpid() != owner:    # a forked data-loader worker ending
            return
        try:
            with open(path, "w") as out:
                out.write("%.6f\n" % time.time())
        except Exception:   # never in the way of the rank's own exit
            pass

    # threading's exit callbacks run before atexit's (Python 3.9+; older: no mark)
    register = getattr(threading, "_register_atexit", None)
    if path and register is not None:
        register(mark)


def _chain():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    _install()
except Exception:   # never a reason for the rank not to start
    pass
try:
    _chain()
except Exception:
    pass
