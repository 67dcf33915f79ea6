"""Load the module of the operation asked for (or every one), then run it.

Every operation is named ``family.verb``, and its family names its module: ``check.host``
and ``run.launch`` live in ``ops_check`` and ``ops_run``. Importing only that module keeps a
call's start-up small; an unknown family falls back to loading every module. For the
same reason nothing here imports ``re`` or ``pkgutil`` up front: together they cost a
host 15 ms of every call (the quick paths of sync are a few tens of milliseconds).
"""
import importlib
import sys

from . import proto

# spelled out: str.isascii is 3.7+ and `string` costs an import on every call
LOWERCASE = "abcdefghijklmnopqrstuvwxyz"


def family_of(name):
    """``check.host`` -> ``check``; '' when the name does not start with a plain family."""
    family = name.partition(".")[0]
    return family if family and not family.strip(LOWERCASE) else ""


def load_ops():
    import pkgutil

    package = sys.modules[__package__]
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("ops_"):
            importlib.import_module("%s.%s" % (__package__, info.name))


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
