"""multihost as a user has it after `pip install multihost`, for benchmarks that time
whole commands.

Running the working tree through an editable install (`pip install -e`) or PYTHONPATH
costs every command more than a user pays: an editable install's `site` hook alone is
about 30 ms of start-up. So the benchmark times a wheel of the working tree, installed
(without its dependencies) into a venv of its own, whose dependencies are the ones this
Python already has: a `.pth` file names this Python's site-packages as a plain path, so
none of the `.pth` hooks there (the editable install's among them) runs.

The venv is made once per content of the tree (a hash of the package's files names it)
under the system's temp directory, and reused by later runs.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(tempfile.gettempdir()) / "multihost-bench-install"
# What the wheel is built from: the package and what its build reads.
SOURCES = ("multihost", "pyproject.toml", "README.md")


def tree_digest() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        top = REPO / name
        paths = [top] if top.is_file() else sorted(
            p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for path in paths:
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def installed_multihost() -> Path:
    """The `multihost` script of a regular install of this tree (made once, then reused)."""
    venv = CACHE / tree_digest()
    script = venv / "bin" / "multihost"
    if script.exists():
        return script
    CACHE.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=CACHE))
    try:
        source = work / "src"
        source.mkdir()
        for name in SOURCES:   # built from a copy: the build leaves nothing in the tree
            if (REPO / name).is_dir():
                shutil.copytree(REPO / name, source / name,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(REPO / name, source / name)
        quiet = {"stdout": subprocess.DEVNULL, "check": True}
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(work / "wheel"), str(source)], **quiet)
        # Made at its final path (its scripts name it); the script comes last, so a venv
        # without it is one a run left half-made.
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], **quiet)
        python = venv / "bin" / "python"
        purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                                  "print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        deps = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]]
                if os.path.isdir(p)]
        Path(purelib, "_bench_deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
        wheel = next((work / "wheel").glob("multihost-*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], **quiet)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return script
