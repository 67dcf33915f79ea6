"""Load every operation module, then run the one asked for."""
import importlib
import pkgutil
import sys

from . import proto


def load_ops():
    package = sys.modules[__package__]
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("ops_"):
            importlib.import_module("%s.%s" % (__package__, info.name))


def main():
    load_ops()
    sys.exit(proto.dispatch(sys.argv))
