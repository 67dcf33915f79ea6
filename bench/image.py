"""`run --image` in the lab (podman in every host): the image to 8 hosts from the
controller against `podman save | ssh HOST podman load` to every host at once by hand,
and the start-up overhead of `--image` against the same run without it (2 hosts x 2
ranks, the image already there).

The image is Debian bookworm's minbase with python3 (tests/lab/test_containers.py builds
and caches its tarball). The image's delivery by multihost is the time of a run that
sends it (`--image-from-controller`, the hosts without it) less the same run with the
image already there. Each way's uplink is what the controller sent into the lab's
switch meanwhile, in copies of the image (`podman save`'s size).
Run as root: python bench/image.py [--runs 3]
"""
from __future__ import annotations

import argparse
import json
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


def uplink_bytes() -> int:
    """What the controller's stack has sent into the lab switch (netlink)."""
    shown = subprocess.run(["ip", "-s", "-j", "link", "show", "dev", "br0"], capture_output=True,
                           text=True, check=True).stdout
    return int(json.loads(shown)[0]["stats64"]["tx"]["bytes"])


def counted(argv) -> tuple:
    """(seconds, uplink bytes) of one command."""
    before = uplink_bytes()
    seconds = timed(argv)
    return seconds, uplink_bytes() - before


def saved_size() -> int:
    done = subprocess.run(f"podman save {IMAGE} | wc -c", shell=True, capture_output=True,
                          text=True, check=True)
    return int(done.stdout.strip())


def drop_image(n: int) -> None:
    loop = " ".join(f"ssh -o BatchMode=yes {h} podman rmi -f {IMAGE} >/dev/null 2>&1 &"
                    for h in addresses(n))
    subprocess.run(["sh", "-c", f"{loop} wait"], check=True)


def by_hand(n: int) -> tuple:
    loop = " ".join(f"podman save {IMAGE} | ssh -o BatchMode=yes {h} podman load >/dev/null &"
                    for h in addresses(n))
    return counted(["sh", "-c", f"{loop} wait"])


def inside(runs: int) -> None:
    code = Path(tempfile.mkdtemp(prefix="mh-image-bench-"))
    (code / "job.py").write_text(JOB)
    sent, warm, hand, hand_up, sent_up = [], [], [], [], []
    for _ in range(runs):
        drop_image(HOSTS)
        seconds, up = by_hand(HOSTS)
        hand.append(seconds)
        hand_up.append(up)
        drop_image(HOSTS)
        seconds, up = counted(run_argv(code, HOSTS, "--image", IMAGE, "--image-from-controller"))
        sent.append(seconds)
        sent_up.append(up)
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
    size = saved_size()
    print(f"  uplink ({size / 2**20:.0f} MiB saved): by hand {med(hand_up) / 2**20:.0f} MiB "
          f"({med(hand_up) / size:.2f} copies), multihost {med(sent_up) / 2**20:.0f} MiB "
          f"({med(sent_up) / size:.2f} copies, the run's sync and launch included)")
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
