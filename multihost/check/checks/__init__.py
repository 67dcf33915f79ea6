"""The preflight's checks, each a judge registered with ``@check`` (see ``..registry``).
Every module of this folder is imported here: a check exists by being in it."""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
