"""Load the module of the operation asked for (or every one), then run it.

Every operation is named ``family.verb``, and FAMILIES names the module that registers a
family's operations: ``check.host`` lives in ``check/ops.py``, ``run.launch`` in
``run/ops.py``; the subpackages mirror the controller's features. Only that module is
imported: every command starts a helper on every host, and importing every family's
module costs each call about 20 ms more of the host's CPU. An unknown family falls back
to loading every module.
"""
import importlib
import sys

from . import proto

# spelled out: str.isascii is 3.7+ and `string` costs an import on every call
LOWERCASE = "abcdefghijklmnopqrstuvwxyz"

FAMILIES = {
    "basic": "basic",
    "check": "check.ops",
    "linktest": "check.linktest",
    "collective": "check.collective",
    "run": "run.ops",
    "stacks": "run.stacks",
    "image": "run.image_ops",
    "slurm": "run.slurm",
    "logs": "logs.ops",
    "sync": "sync.ops",
    "data": "data.ops",
    "hold": "registry.ops",
}


def family_of(name):
    """``check.host`` -> ``check``; '' when the name does not start with a plain family."""
    family = name.partition(".")[0]
    return family if family and not family.strip(LOWERCASE) else ""


def load_ops():
    for module in FAMILIES.values():
        importlib.import_module("%s.%s" % (__package__, module))


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    module = FAMILIES.get(family_of(name))
    if module:
        importlib.import_module("%s.%s" % (__package__, module))
    if name not in proto.OPS:
        load_ops()
    sys.exit(proto.dispatch(sys.argv))
