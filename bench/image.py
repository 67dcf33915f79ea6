"""`run --image` in the lab (podman in every host): the image to 8 hosts from the
controller against `podman save | ssh HOST podman load` to every host at once by hand,
and the start-up overhead of `--image` against the same run without it (2 hosts x 2
ranks, the image already there).

The image is Debian bookworm's minbase with python3 (tests/lab/test_containers.py builds
and caches its tarball). The image's delivery by multihost is the time of a run that
sends it (`--image-from-controller`, the hosts without it) less the same run with the
image already there.
Run as root: python bench/image.py [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _lab import REPO, addresses, bench_lab, timed

HOSTS = 8
IMAGE = "localhost/multihost-bench:bookworm-python3"
ROOTFS = Path(os.environ.get("MULTIHOST_IMAGE_ROOTFS",
                             "/var/cache/multihost-tests/bookworm-python3.tar"))
JOB = "import os\nprint('rank', os.environ['RANK'], flush=True)\n"


def run_argv(code: Path, n: int, *extra: str):
    return [sys.executable, "-m", "multihost", "run", "--ips", ",".join(addresses(n)),
            "--nproc_per_node", "2", "--launcher", "python", "--no-check", "--plain",
            "--code", str(code), "--log_dir", str(code.parent / "log"), *extra, "--", "job.py"]


def drop_image(n: int) -> None:
    loop = " ".join(f"ssh -o BatchMode=yes {h} podman rmi -f {IMAGE} >/dev/null 2>&1 &"
                    for h in addresses(n))
    subprocess.run(["sh", "-c", f"{loop} wait"], check=True)


def by_hand(n: int) -> float:
    loop = " ".join(f"podman save {IMAGE} | ssh -o BatchMode=yes {h} podman load >/dev/null &"
                    for h in addresses(n))
    return timed(["sh", "-c", f"{loop} wait"])


def inside(runs: int) -> None:
    code = Path(tempfile.mkdtemp(prefix="mh-image-bench-"))
    (code / "job.py").write_text(JOB)
    sent, warm, hand = [], [], []
    for _ in range(runs):
        drop_image(HOSTS)
        hand.append(by_hand(HOSTS))
        drop_image(HOSTS)
        sent.append(timed(run_argv(code, HOSTS, "--image", IMAGE, "--image-from-controller")))
        warm.append(timed(run_argv(code, HOSTS, "--image", IMAGE)))
    plain, image = [], []
    for _ in range(runs):
        plain.append(timed(run_argv(code, 2, "--python", sys.executable)))
        image.append(timed(run_argv(code, 2, "--image", IMAGE)))
    med = statistics.median
    delivery = med(sent) - med(warm)
    print(f"image ({ROOTFS.stat().st_size / 2**20:.0f} MiB tar) to {HOSTS} hosts, "
          f"median of {runs}:")
    print(f"  by hand (save | ssh load, all hosts at once): {med(hand):.1f} s")
    print(f"  multihost run --image-from-controller: {med(sent):.1f} s, the same run with "
          f"the image there {med(warm):.1f} s: delivery {delivery:.1f} s "
          f"(ratio to by hand {delivery / med(hand):.2f})")
    print(f"start-up, 2 hosts x 2 ranks: without --image {med(plain):.1f} s, with "
          f"{med(image):.1f} s (+{med(image) - med(plain):.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args.runs)
        return
    from multihost.lab import containers

    if not ROOTFS.exists():
        sys.exit(f"bench: no image tarball {ROOTFS}: run tests/lab/test_containers.py once")
    with bench_lab(HOSTS, containers=True) as lab:
        env = dict(os.environ, PYTHONPATH=str(REPO), **containers.controller_env(lab.paths))
        subprocess.run(["podman", "import", "-q", str(ROOTFS), IMAGE], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        argv = lab.exec_argv([sys.executable, __file__, "--inside", "--runs", str(args.runs)])
        sys.exit(subprocess.call(argv, env=env))


if __name__ == "__main__":
    main()
