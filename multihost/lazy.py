"""Package faces that cost nothing to import (PEP 562).

Each feature package's ``__init__`` names what other packages use and the module that
holds each name; a name is imported from its module on first use, so importing the
package (or one name of it) never loads the rest of the feature: the CLI's start-up
pays only for what the command runs (a sync that finds nothing to do never imports the
sync engine's delivery).
"""
from __future__ import annotations

import importlib
import sys
from typing import Callable, Dict, List, Tuple


def lazy_names(package: str, where: Dict[str, str]) -> Tuple[Callable[[str], object],
                                                              Callable[[], List[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose ``where`` maps
    each public name to the module (inside the package) that defines it."""

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # found once: later uses skip this
        return value

    def __dir__() -> List[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
