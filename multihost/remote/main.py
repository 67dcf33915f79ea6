"""Load the module of the operation asked for (or every one), then run it.

Every operation is named ``family.verb``, and its family names its module: ``check.host``
and ``run.launch`` live in ``ops_check`` and ``ops_run``. Only that module is imported:
every command starts a helper on every host, and importing every family's module costs
each call about 20 ms more of the host's CPU. An unknown family falls back to loading every
module.
"""
import importlib
import os
import sys

from . import proto

# spelled out: str.isascii is 3.7+ and `string` costs an import on every call
LOWERCASE = "abcdefghijklmnopqrstuvwxyz"


def family_of(name):
    """``check.host`` -> ``check``; '' when the name does not start with a plain family."""
    family = name.partition(".")[0]
    return family if family and not family.strip(LOWERCASE) else ""


def load_ops():
    for directory in sys.modules[__package__].__path__:
        for name in sorted(os.listdir(directory)):
            if name.startswith("ops_") and name.endswith(".py"):
                importlib.import_module("%s.%s" % (__package__, name[:-3]))


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    family = family_of(name)
    if family:
        try:
            importlib.import_module("%s.ops_%s" % (__package__, family))
        except ImportError:
            pass
    if name not in proto.OPS:
        load_ops()
    sys.exit(proto.dispatch(sys.argv))
