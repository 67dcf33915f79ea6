"""The preflight's one call per host: everything a host can tell about itself, gathered
in parallel threads within a time budget, returned as raw facts. Judging them (is this a
pass, a warning, a failure?) happens on the controller, where every host is seen at once.

Facts: hostname resolution, the job's python and its torch/paddle/CUDA/NCCL versions
(read from files, never by importing torch, which takes seconds), nvidia-smi, busy ports
and who holds them, interfaces and the route to the first host, free disk in the
workdir, processes left over by earlier multihost runs, ICMP to every other host
(``net_ping``), the clock, with ``--image`` the container engine and the image
(``run/image_ops.describe``), and (on request) the rendezvous test of ``ops_check_net``.
"""
import json
import os
import select
import socket
import sys
import threading
import time

from . import ping as net_ping
from . import net
from ..machine import host_dir, machine_identity
from .. import owners
from .proc import foreign_facts, holds_facts, leftover_facts, ports_facts
from .python import framework_pythons
from ..proto import op, reply

# Runs in the job's own interpreter, with its site-packages, PYTHONPATH and .pth files,
# exactly as the job will start. It finds packages without importing them, and names
# the paths whose change (a pip install, a new .pth) would change its answer.
PYTHON_PROBE = r"""
import json, os, site, sys
out = {"version": sys.version.split()[0], "executable": sys.executable, "prefix": sys.prefix}
try:
    import importlib.util as u
    for name, vfiles in (("torch", ["version.py"]),
                         ("paddle", [os.path.join("version", "__init__.py"), "version.py"])):
        spec = u.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        base = list(spec.submodule_search_locations)[0]
        text = ""
        for vfile in vfiles:
            try:
                with open(os.path.join(base, vfile)) as f:
                    text = f.read(20000)
                break
            except OSError:
                pass
        out[name] = {"path": base, "version_py": text}
    dirs = [p for p in sys.path if p and os.path.isdir(p)]
    for entry in dirs:
        for item in os.listdir(entry):
            if item.startswith(("nvidia_nccl", "paddlepaddle", "torch-")) and item.endswith(".dist-info"):
                out.setdefault("dists", []).append(item)
    user = getattr(site, "USER_SITE", None) or ""
    out["stamp_paths"] = [os.path.realpath(sys.executable)] + dirs + ([user] if user else []) + \
        [os.path.join(out[n]["path"], f) for n, f in (("torch", "version.py"),) if n in out]
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""
PROBE_CACHE = "~/.cache/multihost"


# -- software and devices -------------------------------------------------------------
def _run(argv, timeout):
    """(exit code, stdout, stderr) or None when the program does not exist."""
    import subprocess  # only when a program must run: a warm check starts none
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(argv[0])
    except OSError:
        return None
    return done.returncode, done.stdout.decode("utf-8", "replace"), \
        done.stderr.decode("utf-8", "replace")


def _stamp(paths):
    stamp = []
    for path in paths:
        try:
            stamp.append(os.stat(path).st_mtime_ns)
        except OSError:
            stamp.append(None)
    return stamp


def python_facts(request):
    """The probe's answer; where the job's python lacks a framework (or does not start),
    also the other interpreters here that have one (``others``, see ops_check_python),
    for the fix to name."""
    result = _python_probe(request)
    if "error" in result or "torch" not in result or "paddle" not in result:
        result = dict(result, others=framework_pythons(request.get("prefix"),
                                                       sys.executable or "python3"))
    return result


def _python_probe(request):
    """The probe's answer, cached on the host until one of the paths it depends on
    changes (site-packages gains or loses an entry on every pip install): a warm check
    then costs a few stat calls instead of starting an interpreter with its site."""
    import zlib

    python = sys.executable or "python3"
    key = "\0".join([python, os.environ.get("PYTHONPATH", ""), os.environ.get("PYTHONHOME", ""),
                     os.environ.get("PYTHONUSERBASE", ""), os.environ.get("PYTHONNOUSERSITE", "")])
    cache = os.path.join(host_dir(PROBE_CACHE), "python-probe-%08x.json" % zlib.crc32(key.encode()))
    try:
        with open(cache) as f:
            cached = json.load(f)
        if cached["stamp"] == _stamp(cached["result"]["stamp_paths"]):
            return dict(cached["result"], cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        done = _run([python, "-c", PYTHON_PROBE], request.get("probe_timeout", 15))
    except TimeoutError:
        return {"error": "the python probe did not finish in time"}
    if done is None:
        return {"error": "cannot start %s" % python}
    code, out, err = done
    lines = out.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (ValueError, IndexError):
        tail = (err.strip().splitlines() or ["exit status %d" % code])[-1]
        return {"error": "%s failed at startup: %s" % (python, tail[:200])}
    if "error" not in result and result.get("stamp_paths"):
        try:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            temp = "%s.%d" % (cache, os.getpid())
            with open(temp, "w") as f:
                json.dump({"stamp": _stamp(result["stamp_paths"]), "result": result}, f)
            os.rename(temp, cache)
        except OSError:
            pass  # a read-only home only costs the next check the probe again
    return result


GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used,driver_version,uuid",
             "--format=csv,noheader,nounits"]
APPS_QUERY = ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
              "--format=csv,noheader,nounits"]


def _on_path(program):
    for directory in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        if os.access(os.path.join(directory or ".", program), os.X_OK):
            return True
    return False


def gpu_facts(request):
    timeout = request.get("gpu_timeout", 10)
    if not _on_path("nvidia-smi"):
        return {"missing": True}
    try:
        gpus = _run(GPU_QUERY, timeout)
        if gpus is None:
            return {"missing": True}
        apps = _run(APPS_QUERY, timeout) if gpus[0] == 0 else None
    except TimeoutError:
        return {"timeout": timeout}
    facts = {"code": gpus[0], "out": gpus[1], "err": gpus[2].strip()[-300:]}
    if apps and apps[0] == 0:
        facts["apps"] = apps[1]
    return facts


# -- host ------------------------------------------------------------------------------
def hostname_facts(request):
    name = socket.gethostname()
    facts = {"hostname": name, "machine": machine_identity()}
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
        facts["addresses"] = [info[4][0] for info in infos]
    except OSError as exc:
        facts["error"] = str(exc.strerror or exc)
    return facts


def net_facts(request):
    """The interface towards the first host: where the kernel's route to it leaves."""
    facts = {"interfaces": net.interface_names()}
    master = request.get("master")
    if master:
        source = net.route_source(master)
        facts["route_source"] = source
        facts["route_iface"] = net.iface_of_address(source) if source else None
        facts["master_is_local"] = net.is_local_address(master)
    return facts


def disk_facts(request):
    """The workdir's filesystem, and the workdir itself as this host resolves it: a
    relative path is under the home directory (as the sync takes it), ``real`` has
    ``..`` and symlinks resolved, ``home`` is the home directory so resolved."""
    home = os.path.expanduser("~")
    path = os.path.join(home, os.path.expanduser(request.get("workdir") or "~"))
    existing = path
    while not os.path.isdir(existing) and existing not in ("/", ""):
        existing = os.path.dirname(existing)
    stat = os.statvfs(existing or "/")
    return {"path": path, "exists": existing == path, "existing": existing,
            "free": stat.f_bavail * stat.f_frsize, "total": stat.f_blocks * stat.f_frsize,
            "writable": os.access(existing or "/", os.W_OK),
            "real": os.path.realpath(path), "home": os.path.realpath(home),
            "unsafe": owners.why_unsafe(path)}


def ping_facts(request):
    peers = request.get("peers") or []
    if not peers:
        return {"rtt": {}, "method": "icmp"}
    rtt, method = net_ping.ping_many(peers, request.get("ping_timeout", 1.0))
    return {"rtt": rtt, "method": method}


def data_facts(request):
    found = {}
    for path in request.get("data") or []:
        full = os.path.expanduser(path)
        found[path] = {"exists": os.path.exists(full), "dir": os.path.isdir(full)}
    return found


def connect_facts(request):
    c = request["connect"]
    return net.connect_master(c["address"], c["port"], c["token"], c["rank"],
                              c.get("timeout", 3.0))


def image_facts(request):
    from ..run.image_ops import describe

    return describe(request.get("image"), request.get("engine"))


PROBES = {
    "hostname": hostname_facts, "python": python_facts, "gpus": gpu_facts,
    "ports": ports_facts, "net": net_facts, "disk": disk_facts, "leftovers": leftover_facts,
    "ping": ping_facts, "connect": connect_facts, "data": data_facts,
    "holds": holds_facts, "foreign": foreign_facts, "image": image_facts,
}


def gather(request):
    """Run the probes the request names, each in its own thread, within its budget (the
    request's ``budget``, or its own in ``budgets``), counted from their common start; a
    probe still running at its deadline is reported as timed out, never waited for."""
    sampled, sampled_at = time.time(), time.monotonic()
    wanted = [name for name in request.get("probes", []) if name in PROBES]
    results, errors = {}, {}

    def one(name):
        try:
            results[name] = PROBES[name](request)
        except Exception as exc:  # a probe's bug must not cost the other facts
            errors[name] = "%s: %s" % (type(exc).__name__, exc)

    threads = []
    for name in wanted:
        thread = threading.Thread(target=one, args=(name,))
        thread.daemon = True  # a probe stuck in a hung NFS mount must not keep us alive
        thread.start()
        threads.append(thread)
    budget = float(request.get("budget", 8.0))
    longer = request.get("budgets") or {}
    for name, thread in zip(wanted, threads):
        deadline = sampled_at + max(budget, float(longer.get(name, 0.0)))
        thread.join(max(0.0, deadline - time.monotonic()))
    facts = dict(results)
    facts["errors"] = errors
    facts["timed_out"] = [n for n in wanted if n not in results and n not in errors]
    facts["cpus"] = _cpu_count()
    facts["helper_python"] = sys.version.split()[0]
    facts["time"] = sampled
    facts["age"] = time.monotonic() - sampled_at
    return facts


def _cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


@op("check.host")
def check_host(request):
    """The facts the request's probes gather. With ``await_listener`` (another host's
    call, started beside the first host's), every probe but ``connect`` runs at once, and
    ``connect`` once the controller says the first host listens: a line on stdin (or
    its end)."""
    if not request.get("await_listener") or "connect" not in request.get("probes", []):
        return gather(request)
    box = {}

    def others():
        box["facts"] = gather(dict(request, probes=[p for p in request["probes"]
                                                    if p != "connect"]))
        box["gathered"] = time.monotonic()

    thread = threading.Thread(target=others)
    thread.daemon = True
    thread.start()
    select.select([sys.stdin], [], [], float(request.get("await_for", 60)))
    connect = gather(dict(request, probes=["connect"]))
    thread.join()
    facts = box["facts"]
    if "connect" in connect:
        facts["connect"] = connect["connect"]
    facts["errors"].update(connect["errors"])
    facts["timed_out"] += connect["timed_out"]
    facts["age"] += time.monotonic() - box["gathered"]   # the clock sample's age at the reply
    return facts


@op("check.host_hold", stream=True)
def check_host_hold(request):
    """The first host's call: listen on the master port first (say so on a line of its
    own), gather facts, then hold the listener until the controller closes stdin (every
    other host has tried to connect), and reply like any operation."""
    listen = request["listen"]
    family = net_ping.family_of(listen.get("address", "0.0.0.0"))
    listener = net.Listener(listen["port"], listen["token"], family)
    sys.stdout.write(json.dumps({"listening": listener.error is None,
                                 "error": listener.error}) + "\n")
    sys.stdout.flush()
    if listener.error is None:  # our own listener holds the port: not a conflict
        request = dict(request, own_ports=[listen["port"]], own_inodes=[listener.inode])
    facts = gather(request)
    gathered = time.monotonic()
    hold_until = gathered + float(request.get("hold", 30))
    while time.monotonic() < hold_until:
        ready = select.select([sys.stdin], [], [], max(0.0, hold_until - time.monotonic()))[0]
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
    facts["rendezvous"] = listener.close()
    facts["age"] += time.monotonic() - gathered  # the clock sample's age at the reply
    facts["held"] = True
    reply({"ok": True, "result": facts})
    return 0
