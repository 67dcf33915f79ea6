"""Benchmark: bytes written to a filesystem that 3 hosts share, by one `multihost sync`
of a 30 MB, 1,500-file tree into a workdir on it.

    sudo python bench/shared_home_bytes.py                      # this tree
    sudo python bench/shared_home_bytes.py --checkout OTHER     # another checkout's

The shared filesystem is an ext4 image on a loop device, mounted before the lab is up
and shown in every host at the same path (`lab up 3 --share DIR`): one directory on
every host, as an NFS export is. What was written is the filesystem's own count
(/sys/fs/ext4/<dev>/lifetime_write_kbytes, after a `sync`): data, metadata and journal,
whatever wrote it. One copy of the tree is about 30 MB plus the journal's share; a
sync that writes the tree once per host writes about 3 times that. The sync's wall time
is printed too: `--hosts 1` against `--hosts N` is the cost of N hosts sharing it.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _lab import addresses, bench_lab  # noqa: E402

FILES, EACH = 1500, 20000


def written_kb(device: str) -> int:
    os.sync()
    return int(Path(f"/sys/fs/ext4/{device}/lifetime_write_kbytes").read_text())


def make_tree(root: Path) -> int:
    for i in range(FILES):
        directory = root / f"pkg{i % 30}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"m{i}.py").write_bytes(os.urandom(EACH))
    return FILES * EACH


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", default=str(REPO),
                        help="the multihost checkout to measure (default: this one)")
    parser.add_argument("--hosts", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mhbytes-") as tmp:
        image, mount, code = Path(tmp) / "fs.img", Path(tmp) / "shared", Path(tmp) / "code"
        subprocess.run(["truncate", "-s", "512M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
        mount.mkdir()
        subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
        try:
            device = os.path.basename(subprocess.run(
                ["findmnt", "-n", "-o", "SOURCE", str(mount)], capture_output=True,
                text=True, check=True).stdout.strip())
            size = make_tree(code)
            with bench_lab(args.hosts, shares=[str(mount)]) as lab:
                before = written_kb(device)
                env = dict(os.environ, PYTHONPATH=args.checkout)
                started = time.perf_counter()
                done = subprocess.run(lab.exec_argv([
                    sys.executable, "-m", "multihost", "sync", "--ips",
                    ",".join(addresses(args.hosts)), "--workdir", str(mount / "work"),
                    "--plain", "--code", str(code)]), env=env, capture_output=True, text=True,
                    cwd=tmp)
                seconds = time.perf_counter() - started
                after = written_kb(device)
            print(done.stdout + done.stderr, end="")
            written = (after - before) * 1024
            print(f"tree {size / 1e6:.1f} MB, {FILES} files, {args.hosts} hosts sharing "
                  f"the workdir: {written / 1e6:.1f} MB written ({written / size:.2f} copies)"
                  f"; sync exit {done.returncode} in {seconds:.1f} s")
        finally:
            subprocess.run(["umount", str(mount)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
