"""The collective check's job on one host (``collective.run``): the script comes on
stdin, is written into a private temporary directory, and runs once per local rank
with this interpreter (the job's python), each rank in its own process group, with the
environment torchrun would give it. The call returns when every rank has exited, or
kills every rank's group at its deadline; either way the directory is removed and
nothing is left running.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ..proto import OpError, op

MARK = "MULTIHOST-COLLECTIVE "
TAIL = 2000


def _kill(procs):
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
    for proc in procs:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def _env(request, local_rank):
    env = dict(os.environ)
    env.update({
        "RANK": str(int(request["rank_offset"]) + local_rank), "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(int(request["world_size"])),
        "LOCAL_WORLD_SIZE": str(int(request["nproc"])),
        "MASTER_ADDR": str(request["master_addr"]), "MASTER_PORT": str(int(request["master_port"])),
        "PYTHONUNBUFFERED": "1",
    })
    if request.get("iface"):
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = str(request["iface"])
    if request.get("gpus"):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(int(g)) for g in request["gpus"])
    return env


@op("collective.run")
def run(request):
    script = sys.stdin.buffer.read()
    if not script:
        raise OpError("no script came on stdin", "run multihost check again")
    deadline = time.monotonic() + float(request["timeout"])
    place = tempfile.mkdtemp(prefix="multihost-collective-")
    procs = []
    try:
        path = os.path.join(place, "collective_bench.py")
        with open(path, "wb") as f:
            f.write(script)
        argv = [sys.executable, path] + [str(a) for a in request["args"]]
        for local_rank in range(int(request["nproc"])):
            with open(os.path.join(place, "out.%d" % local_rank), "wb") as out:
                procs.append(subprocess.Popen(
                    argv, cwd=place, env=_env(request, local_rank), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        timed_out = False
        while any(p.poll() is None for p in procs):
            if time.monotonic() >= deadline:
                timed_out = True
                break
            if any(p.poll() not in (None, 0) for p in procs):
                time.sleep(0.5)  # let the others print why, then stop them all
                break
            time.sleep(0.05)
        _kill(procs)
        result, tails = None, []
        for local_rank, proc in enumerate(procs):
            with open(os.path.join(place, "out.%d" % local_rank), "rb") as f:
                text = f.read().decode("utf-8", "replace")
            for line in text.splitlines():
                if line.startswith(MARK):
                    try:
                        result = json.loads(line[len(MARK):])
                    except ValueError:
                        pass
            if proc.returncode != 0:
                tails.append({"local_rank": local_rank, "exit": proc.returncode,
                              "tail": text[-TAIL:]})
        return {"result": result, "failed": tails, "timed_out": timed_out}
    finally:
        _kill(procs)
        shutil.rmtree(place, ignore_errors=True)
