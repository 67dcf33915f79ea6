"""Which launcher a run gets when the user did not say: the one of the framework the
script imports.

PaddlePaddle's docs start every job with ``python -m paddle.distributed.launch``; a user
who types ``multihost run --ips=a,b -- tools/train.py -c cfg.yml`` for a PaddleDetection
script means paddle's launcher, and torchrun would start it as a lone process. So the
script (and the modules of the code directory it imports, a few levels down, as
PaddleDetection's ``tools/train.py`` imports ``ppdet``) is read with ``ast``, never run:
a script that imports paddle and not torch runs under paddle's launcher; anything else
keeps the default, torchrun. ``--launcher`` and the hostfile's ``launcher`` always win.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Set, Tuple

from .launchers import DEFAULT_TEMPLATE

# Top-level modules that mean one framework. The suites import paddle themselves, but
# a script may only import the suite (``from ppdet.engine import Trainer``).
FRAMEWORK_MODULES = {
    "paddle": ("paddle", "paddlenlp", "paddleseg", "paddleocr", "ppdet", "ppocr", "ppcls",
               "paddlex", "paddlerec", "paddlets", "paddlespeech"),
    "torch": ("torch", "torchvision", "torchaudio", "lightning", "pytorch_lightning",
              "deepspeed", "accelerate"),
}
MAX_FILES = 200            # local modules read at most: a big repository stays quick


@dataclass(frozen=True)
class LauncherChoice:
    name: str              # a built-in template name or a file
    reason: str            # one line for the user: why this launcher

    def line(self) -> str:
        return f"launcher {self.name}: {self.reason}"


def _imports(path: str) -> Iterator[Tuple[str, int]]:
    """(dotted module name, relative level) of every import in a file that parses."""
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, 0
        elif isinstance(node, ast.ImportFrom):
            yield node.module or "", node.level
            for alias in node.names:  # `from pkg import module` may name a local file
                if node.module:
                    yield f"{node.module}.{alias.name}", node.level


def _local_file(module: str, level: int, here: str, roots: Sequence[str]) -> Optional[str]:
    """The file of the code directory a module name points to, if it is one."""
    parts = [p for p in module.split(".") if p]
    bases = [here] if level else list(roots)
    if level > 1:
        bases = [os.path.normpath(os.path.join(here, *[".."] * (level - 1)))]
    for base in bases:
        stem = os.path.join(base, *parts) if parts else base
        for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


def frameworks_imported(script: str, code_dir: str) -> Set[str]:
    """The frameworks a script imports, itself or through local modules of code_dir."""
    found: Set[str] = set()
    code_root = os.path.abspath(code_dir)
    start = os.path.abspath(os.path.join(code_dir, script))
    # Where `import x` finds local code: the script's own directory (python puts it
    # first on sys.path), then the code directory (scripts add it, as tools/train.py does).
    roots = [os.path.dirname(start), code_root]
    queue, seen = [start], {start}
    while queue and len(seen) <= MAX_FILES:
        path = queue.pop(0)
        for module, level in _imports(path):
            top = module.split(".")[0]
            for framework, modules in FRAMEWORK_MODULES.items():
                if level == 0 and top in modules:
                    found.add(framework)
            local = _local_file(module, level, os.path.dirname(path), roots)
            if local and local not in seen and local.startswith(code_root + os.sep):
                seen.add(local)
                queue.append(local)
    return found


def script_file(command: Sequence[str], no_python: bool) -> Optional[str]:
    """The python file after ``--`` (``-m pkg.mod`` becomes ``pkg/mod.py``), or None."""
    if no_python or not command:
        return None
    if command[0] == "-m" and len(command) > 1:
        return command[1].replace(".", os.sep) + ".py"
    if command[0].endswith(".py") and not command[0].startswith("-"):
        return command[0]
    return None


def choose_launcher(command: Sequence[str], code_dir: str, *, no_python: bool = False,
                    given: Optional[str] = None, hostfile: Optional[str] = None) -> LauncherChoice:
    if given:
        return LauncherChoice(given, "--launcher")
    if hostfile:
        return LauncherChoice(hostfile, "the hostfile's launcher")
    script = script_file(command, no_python)
    if script is None or not os.path.isfile(os.path.join(code_dir, script)):
        return LauncherChoice(DEFAULT_TEMPLATE, "the default (--launcher NAME to choose)")
    found = frameworks_imported(script, code_dir)
    if found == {"paddle"}:
        return LauncherChoice("paddle", f"{script} imports paddle, not torch "
                                        "(--launcher NAME to choose another)")
    if found == {"torch"}:
        return LauncherChoice(DEFAULT_TEMPLATE, f"{script} imports torch")
    what = "both torch and paddle" if found else "neither torch nor paddle"
    return LauncherChoice(DEFAULT_TEMPLATE, f"the default: {script} imports {what} "
                                            "(--launcher NAME to choose)")
