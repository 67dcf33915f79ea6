"""Load the module of the operation asked for (or every one), then run it.

An operation's name starts with its family, which names its module: ``check.host`` and
``run-launch`` live in ``ops_check`` and ``ops_run``. Importing only that module keeps a
call's start-up small; an unknown family falls back to loading every module.
"""
import importlib
import pkgutil
import re
import sys

from . import proto


def load_ops():
    package = sys.modules[__package__]
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("ops_"):
            importlib.import_module("%s.%s" % (__package__, info.name))


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    family = re.split(r"[.\-_]", name, 1)[0]
    if re.match(r"^[a-z]+$", family):
        try:
            importlib.import_module("%s.ops_%s" % (__package__, family))
        except ImportError:
            pass
    if name not in proto.OPS:
        load_ops()
    sys.exit(proto.dispatch(sys.argv))
