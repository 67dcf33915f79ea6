"""The images the container lab tests run, built here (no registry is reachable) and
cached outside the repository, so a machine builds each once.

bookworm-python3.tar  Debian bookworm's minbase with python3-minimal: the ranks of the
                      plain tests (about 1.5 minutes, 235 MB).
bookworm-torch.tar    bookworm's minbase with the full python3 (torch imports the stdlib
                      that python3-minimal leaves out) and the CPU torch of the
                      interpreter running the tests, copied with its dependencies
                      (about 2 minutes, 1 GB): a real DDP job inside an image.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CACHE = Path("/var/cache/multihost-tests")
MIRROR = "http://deb.debian.org/debian"
BASE_ROOTFS = Path(os.environ.get("MULTIHOST_IMAGE_ROOTFS", CACHE / "bookworm-python3.tar"))
TORCH_ROOTFS = Path(os.environ.get("MULTIHOST_TORCH_ROOTFS", CACHE / "bookworm-torch.tar"))
BOOKWORM_PYTHON = (3, 11)
# torch's own requirements (its METADATA), which `import torch` and DDP reach.
TORCH_DISTS = ("torch", "filelock", "typing_extensions", "sympy", "mpmath", "networkx",
               "jinja2", "markupsafe", "fsspec")
# Parts of the wheel a job never reaches: C++ headers and torch's own tests (torch/bin
# stays: `import torch` wants its torch_shm_manager).
TORCH_SKIPPED = ("torch/include/", "torch/test/")


def base_rootfs() -> Path:
    """Debian bookworm's minbase with python3-minimal, as a tar."""
    return _cached(BASE_ROOTFS, "python3-minimal", lambda tree: None)


def torch_rootfs() -> Path:
    """bookworm with python3 and this interpreter's torch (CPU), as a tar."""
    if TORCH_ROOTFS.exists():
        return TORCH_ROOTFS
    if sys.version_info[:2] != BOOKWORM_PYTHON:
        pytest.skip(f"no torch image: the tests' python is {sys.version_info[:2]}, "
                    f"bookworm's is {BOOKWORM_PYTHON} (torch's binaries are per version)")
    try:
        import torch  # noqa: F401  (only where it is: its files are copied)
    except ImportError:
        pytest.skip("no torch image: torch is not installed here (pip install torch)")
    return _cached(TORCH_ROOTFS, "python3", _add_torch)


def _add_torch(tree: Path) -> None:
    from importlib import metadata

    target = tree / "usr/local/lib/python3.11/dist-packages"
    for name in TORCH_DISTS:
        dist = metadata.distribution(name)
        for item in dist.files or ():
            relative = str(item)
            if relative.startswith("..") or relative.startswith(TORCH_SKIPPED):
                continue
            source = Path(dist.locate_file(item))
            if source.is_file():
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / relative)


def _cached(tarball: Path, include: str, extra) -> Path:
    if tarball.exists():
        return tarball
    if not shutil.which("debootstrap") and not os.access("/usr/sbin/debootstrap", os.X_OK):
        pytest.skip("no image to run: debootstrap is not installed (scripts/setup.sh)")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    tree = tarball.with_suffix(f".rootfs-{os.getpid()}")
    shutil.rmtree(tree, ignore_errors=True)
    built = subprocess.run(["debootstrap", "--variant=minbase", f"--include={include}",
                            "bookworm", str(tree), MIRROR], capture_output=True, text=True,
                           timeout=900)
    if built.returncode != 0:
        shutil.rmtree(tree, ignore_errors=True)
        pytest.skip(f"no image to run: debootstrap failed: {built.stderr.strip()[-300:]}")
    extra(tree)
    # Another build at once (xdist) writes its own partial file; the rename is atomic.
    partial = tarball.with_suffix(f".partial-{os.getpid()}")
    subprocess.run(["tar", "-C", str(tree), "-cf", str(partial), "."], check=True)
    partial.rename(tarball)
    shutil.rmtree(tree, ignore_errors=True)
    return tarball
