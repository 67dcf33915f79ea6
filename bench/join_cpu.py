"""The CPU of one relay hop's join, the shell join against Python's (both from this
checkout), without the ssh around it: the hop's line run by bash as sshd runs it (its
stdin a pipe), a relay node's rendezvous in this process, a small stream through.

    python bench/join_cpu.py [--hops 20] [--rounds 3] [--python /usr/bin/python3]

CPU is user + system of each join process and every process it waited for (mkfifo),
from wait4(); the two kinds alternate, a round of each at a time. The helper is
unpacked into a temporary HOME, as a host has it.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from multihost import helper  # noqa: E402
from multihost.hosts import Host  # noqa: E402
from multihost.remote.sync_relay import Rendezvous  # noqa: E402
from multihost.sync.transfer import _HostOnly, hop_line  # noqa: E402

TOKEN = "0123456789abcdef0123456789abcdef"


def install_helper(home: Path) -> None:
    target = home / ".cache" / "multihost" / f"helper-{helper.helper_id()}"
    target.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(helper.helper_archive())) as archive:
        archive.extractall(target)


def one_hop(line: str, env: dict) -> float:
    """CPU seconds of one join, from its start to its end (its node has read 64 KB)."""
    node = Rendezvous(TOKEN)
    hop_r, hop_w = os.pipe()
    join = subprocess.Popen(["bash", "-c", line], stdin=hop_r, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)
    os.close(hop_r)
    control_r, control_w = os.pipe()
    try:
        os.write(hop_w, b"x" * 65536)
        os.close(hop_w)
        with os.fdopen(control_r, "rb", buffering=0) as control:
            stream = node.upstream(control, wait=30)
            while stream.read(1 << 20):
                pass
            stream.done()
        join.stdout.read()
        _, status, usage = os.wait4(join.pid, 0)
        join.returncode = status
        stream.close()
        if status:
            raise SystemExit("bench: a join failed")
        return usage.ru_utime + usage.ru_stime
    finally:
        os.close(control_w)
        node.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hops", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="the hosts' python (the lab hosts': sshd's PATH finds this one)")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="join-cpu-"))
    os.environ["HOME"] = str(home)  # the node's relay directory, and the joins'
    install_helper(home)
    host = Host(name="h", rank=1, python=args.python)
    request = " " + shlex.quote(json.dumps({"token": TOKEN}))
    python_line = helper.helper_command(_HostOnly(host), "sync.join", {"token": TOKEN})
    lines = {"python join": python_line, "shell join": hop_line(host, "sync.join") + request}
    env = dict(os.environ, HOME=str(home))
    env.pop("PYTHONPATH", None)
    for line in lines.values():  # warm: bytecode written, caches filled
        one_hop(line, env)
    cpu = {kind: [] for kind in lines}
    wall = {kind: [] for kind in lines}
    for _ in range(args.rounds):
        for kind, line in lines.items():
            started = time.perf_counter()
            cpu[kind].append(sum(one_hop(line, env) for _ in range(args.hops)))
            wall[kind].append(time.perf_counter() - started)
    for kind in lines:
        per_hop = [1000 * c / args.hops for c in cpu[kind]]
        print(f"{kind}: CPU {statistics.median(per_hop):.2f} ms a hop (rounds of {args.hops}: "
              f"{', '.join(f'{v:.2f}' for v in per_hop)}), wall "
              f"{1000 * statistics.median(wall[kind]) / args.hops:.1f} ms a hop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
