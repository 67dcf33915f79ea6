"""Operations of ``multihost run`` on a host: prepare, launch, status, stop.

prepare  takes the host lock, creates the run directory, reports the absolute paths and
         addresses the controller needs to render the launcher's command. Done on every
         host before anything starts anywhere, so a busy host stops the run early.
launch   starts the detached supervisor (supervisor.py) and returns once the
         launcher runs. The request comes on stdin: env values never appear in argv.
         Started "held" beside the prepare, it reads its spec, then the word "go",
         when its node's turn comes: the interpreter's start is not on the launch's path.
status   node.json, whether the supervisor still lives, every rank's exit, log tails.
watch    the same as a stream: one JSON line on every change and at least every second,
         until the node has finished (one process per host instead of one per poll:
         a helper start costs ~0.1 s of CPU on the host, a watch loop next to nothing).
         A followed run's monitor opens it only once every node launched, so it carries
         the word that they did (``"launched": true``): no round trip of its own.
launched tells the node that every node of the run launched: without that word by the
         launch deadline (prepare + --launch-timeout), a node stops its ranks itself,
         and a node never launched counts as stopped, so a controller lost half way
         through a launch leaves no rank waiting in a rendezvous that never fills.
         Called by a run that is not followed (--detach) and under Slurm.
stop     asks the supervisor to stop the run (grace, then SIGKILL) and waits for its
         final record; without a supervisor, stops the run's processes itself.
"""
import json
import os
import sys
import time

from ..registry import holds
from ..registry import ops as ops_hold
from . import attempt as run_attempt
from . import files as run_files
from . import processes
from .status_and_stop import (StopLines, ask_stop, end_stop, expire_unlaunched, node_or_fail,
                              node_status, say_launched)
from ..sync import lock as sync_lock
from .. import owners
from ..proto import OpError, op

SIOCGIFADDR = 0x8915
LAUNCH_TIMEOUT = 30.0
QUICK_TICK = 0.05


def _run_dir(request):
    try:
        return run_files.run_dir(request.get("run_id"))
    except ValueError as err:
        raise OpError(str(err), "give a run id like 20250101-120000-ab12")


def _interfaces():
    """{interface: IPv4 address} of this host, by ioctl (no ip/ifconfig needed)."""
    import fcntl
    import socket
    import struct

    found = {}
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:
                raw = fcntl.ioctl(sock.fileno(), SIOCGIFADDR,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            found[name] = socket.inet_ntoa(raw[20:24])
    return found


def refuse_foreign_workdir(workdir):
    """A workdir of the system, or one another account may change (she would swap the
    code between the sync and the launch, and it would run as us), is never run from."""
    if owners.is_system_dir(workdir):
        raise OpError("the workdir %s is a system directory: a job is never run there"
                      % os.path.realpath(workdir),
                      "run it from a directory of its own (cd there, or give --workdir)")
    unsafe = owners.why_unsafe(workdir)
    if unsafe:
        raise OpError("the workdir %s is not only yours: %s" % (workdir, unsafe),
                      owners.fix_for(workdir, unsafe))


@op("run.prepare")
def prepare(request):
    import pkgutil
    import socket

    run_files.root_dir(make=True)  # this host's own, before anything is written there
    run_dir = _run_dir(request)
    run_id = request["run_id"]
    # A relative workdir is relative to the home directory, as for ssh and the sync, even
    # when the helper runs elsewhere (this machine's host runs in the controller's cwd).
    workdir = os.path.join(os.path.expanduser("~"), os.path.expanduser(request.get("cwd") or "~"))
    if not os.path.isdir(workdir) and request.get("make_cwd"):
        try:
            os.makedirs(workdir, 0o700)
        except OSError:
            pass   # refused just below, naming the workdir
    if not os.path.isdir(workdir):
        raise OpError("workdir %s does not exist" % workdir,
                      "sync the code there (run without --no-sync) or give the right --workdir")
    refuse_foreign_workdir(workdir)
    try:  # a tree a sync is writing, or left half written, is never run
        sync_lock.check_for_run(workdir, run_id, in_place=bool(request.get("in_place")))
    except sync_lock.Busy as busy:
        raise OpError(busy.text, busy.fix)
    node_path = os.path.join(run_dir, "node.json")
    attempt = int(request.get("attempt") or 0)
    if attempt:
        run_attempt.archive_attempt(run_dir, attempt)
    run_files.private_dirs(os.path.join(run_dir, "log"))
    try:  # claimed atomically: two entries of one machine prepare at the same moment
        os.close(os.open(node_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        # Run ids are new for every run: another entry of this very run prepared here.
        raise OpError("run %s already exists on this host: the machine is listed twice "
                      "(under another name or address)" % run_id,
                      "list each machine once in --ips or the hostfile (`multihost check` "
                      "names the entries)")
    try:
        ops_hold.claim(request)
    except OpError:
        os.unlink(node_path)
        raise
    if not request.get("allow_concurrent"):
        try:
            run_files.take_lock(run_id, max(float(request.get("stale_after", 120)),
                                            float(request.get("launch_timeout") or 0) + 30))
        except run_files.Busy as busy:
            os.unlink(node_path)
            holds.remove("run", run_id)
            holder = busy.holder.get("run_id")
            since = time.strftime("%H:%M:%S", time.localtime(float(busy.holder.get("time") or 0)))
            raise OpError("busy: run %s holds this host (since %s)" % (holder, since),
                          "wait for it, stop it with `multihost stop %s`, or pass "
                          "--allow-concurrent" % holder)
    wrapper = pkgutil.get_data(__package__, "rankwrap.py")
    with os.fdopen(os.open(os.path.join(run_dir, "rankwrap.py"),
                           os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        out.write(wrapper)
    hook = pkgutil.get_data(__package__, "stackhook.py")
    run_files.private_dirs(os.path.join(run_dir, "stackhook"))
    with os.fdopen(os.open(os.path.join(run_dir, "stackhook", "sitecustomize.py"),
                           os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        out.write(hook)
    run_files.write_json(node_path, {
        "run_id": run_id, "node_rank": request.get("node_rank"), "state": "prepared",
        "attempt": attempt, "launch_timeout": request.get("launch_timeout"),
        "prepared": time.time(), "allow_concurrent": bool(request.get("allow_concurrent"))})
    return {"home": os.path.expanduser("~"), "run_dir": run_dir, "workdir": os.path.abspath(workdir),
            "hostname": socket.gethostname(), "interfaces": _interfaces(),
            "python": sys.executable, "time": time.time()}


def start_supervisor(spec, run_dir, kept=None):
    """The supervisor in a new session with no inherited descriptor but the pipe that
    tells us it started. Detached (a double fork, re-parented away from the ssh
    session), or, given ``kept``, our own child, its pid appended there (a Slurm step:
    remote/run/slurm.py)."""
    from .supervisor_main import supervise

    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_fd)
            os.setsid()
            if kept is None and os.fork() != 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR)
            log = os.open(os.path.join(run_dir, "supervisor.log"),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(devnull, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.closerange(3, write_fd)
            os.closerange(write_fd + 1, 65536)
            os.chdir("/")
            code = supervise(spec, run_dir, write_fd)
        finally:
            os._exit(code)
    os.close(write_fd)
    if kept is None:
        os.waitpid(pid, 0)
    else:
        kept.append(pid)
    return _read_reply(read_fd)


def _read_reply(fd):
    import select

    chunks = []
    deadline = time.time() + LAUNCH_TIMEOUT
    try:
        while time.time() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.time()))
            if not ready:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", "replace").strip()
    try:
        return json.loads(text.splitlines()[-1]) if text else None
    except ValueError:
        return None


@op("run.launch")
def launch(request, kept=None):
    if request.get("held"):
        # Started beside the prepare, this waits for its turn with the supervisor loaded:
        # the spec, then the word "go". Without the word (the launch stopped before this
        # node's turn, the controller went away) nothing starts here.
        from . import supervisor_main  # noqa: F401

        text, _, word = sys.stdin.read().partition("\n")
        if word.strip() != "go":
            raise OpError("not launched: the launch stopped before this node's turn",
                          "see the first error of the run; then start it again")
    else:
        text = sys.stdin.read()
    spec = json.loads(text or "{}")
    spec.update(request)
    run_dir = _run_dir(spec)
    node = run_files.read_json(os.path.join(run_dir, "node.json"), {}) or {}
    if node.get("state") != "prepared":
        raise OpError("run %s is not prepared on this host (state %s)"
                      % (spec["run_id"], node.get("state")), "start a new run")
    run_files.write_json(os.path.join(run_dir, "spec.json"), {
        key: spec.get(key) for key in ("run_id", "node_rank", "cwd", "spawn", "nproc",
                                       "rank_offset", "world_size", "grace", "display")})
    if run_files.launch_expired(run_dir, node):
        expire_unlaunched(run_dir, node)
        raise OpError(run_files.LAUNCH_LOST, "start the run again: multihost rerun %s"
                      % spec["run_id"])
    reply = start_supervisor(spec, run_dir, kept)
    if not reply:
        raise OpError("the supervisor ended before starting the launcher",
                      "read %s/supervisor.log on this host" % run_dir)
    if not reply.get("ok"):
        if reply.get("fix"):  # it knows the fix (the image, the engine)
            raise OpError(reply.get("error") or "the launcher did not start", reply["fix"])
        if reply.get("log"):  # the supervisor itself failed: its traceback is there
            raise OpError(reply.get("error") or "supervisor crashed",
                          "read %s on this host; this is a bug in multihost, please report "
                          "it with that file" % reply["log"])
        # Point only at a log that exists and says something (none under @spawn rank).
        said = [path for path in (os.path.join(run_dir, "launcher.log"),
                                  os.path.join(run_dir, "supervisor.log"))
                if os.path.isfile(path) and os.path.getsize(path)]
        raise OpError(reply.get("error") or "the launcher did not start",
                      "check --python and the launcher template"
                      + ("; see %s" % said[0] if said else ""))
    return reply["node"]


@op("run.launched")
def launched(request):
    """Every node of the run launched: this node's job may go on past its launch
    deadline. Refused when the node already gave up (its deadline passed first)."""
    run_dir = _run_dir(request)
    say_launched(run_dir)
    node = node_or_fail(run_dir, request["run_id"])
    # A job that already ended by itself did start everywhere it ran: only a node that
    # gave up waiting refuses the word.
    if node.get("stop_reason") == run_files.LAUNCH_LOST:
        raise OpError("the node gave up before it heard that every node launched (%s)"
                      % (node.get("stop_reason") or node.get("state")),
                      "start the run again with a longer --launch-timeout")
    return {}


@op("run.status")
def status(request):
    run_dir = _run_dir(request)
    node = node_or_fail(run_dir, request["run_id"])
    return node_status(run_dir, node, int(request.get("tail") or 0),
                       tail_rank=request.get("tail_rank"))


@op("run.watch", stream=True)
def watch(request):
    """Stream the node's status: a line when it changes, a heartbeat line every
    ``heartbeat`` seconds (so the controller can tell a dead link), and a last line with
    ``"final": true`` once the node has finished. Ends when the controller goes away.

    A line ``{"stop": {"grace": G, "reason": R}}`` on stdin stops the run here as
    ``run.stop`` does, without a new helper or a new session per host: a teardown of 64
    hosts paid 64 interpreter starts on the hosts and 64 channel openings on the
    controller. The stream then reports the stop like any other change.

    With ``"launched": true`` the node is first told that every node launched, as
    ``run.launched`` does; a node that gave up before (its deadline passed) reports
    itself stopped for that reason on the stream's first line."""
    import select

    run_dir = _run_dir(request)
    if request.get("launched") and os.path.isfile(os.path.join(run_dir, "node.json")):
        say_launched(run_dir)
    interval = float(request.get("interval", 0.2))
    heartbeat = float(request.get("heartbeat", 1.0))
    # Looked at every QUICK_TICK in the first ``quick_for`` seconds (waits.quick_start): a
    # short job's end is then heard at once; a long one costs the host the usual ticks.
    quick_until = time.time() + float(request.get("quick_for") or 0)
    out = sys.stdout
    last_key, last_sent, procs, procs_at = None, 0.0, None, 0.0
    commands = StopLines() if request.get("stoppable") else None
    stop_deadline = None   # (time, grace, reason): when the stop is finished by hand
    try:
        while True:
            node = run_files.read_json(os.path.join(run_dir, "node.json"))
            if not isinstance(node, dict):
                out.write(json.dumps({"ok": False, "error": "no run %s on this host"
                                      % request.get("run_id")}) + "\n")
                out.flush()
                return 1
            now = time.time()
            if stop_deadline is not None and now >= stop_deadline[0] \
                    and node.get("state") not in run_files.FINAL_STATES:
                node = end_stop(request["run_id"], run_dir, node, *stop_deadline[1:])
                stop_deadline = None
            result = node_status(run_dir, node, 0, count_procs=False)
            final = result["state"] in run_files.FINAL_STATES
            if now - procs_at >= 2.0 or final:  # a /proc scan: not on every tick
                procs = len(processes.run_processes(node.get("run_id") or "", None))
                procs_at = now
            result["procs"] = procs
            key = json.dumps([result["node"], result["ranks"], result["state"]], sort_keys=True)
            if key != last_key or now - last_sent >= heartbeat or final:
                result["final"] = final
                out.write(json.dumps(result) + "\n")
                out.flush()
                last_key, last_sent = key, now
            if final:
                return 0
            tick = min(interval, QUICK_TICK) if now < quick_until else interval
            if commands is None or commands.closed:
                time.sleep(tick)
                continue
            select.select([0], [], [], tick)
            for stop in commands.read():
                grace, reason = stop
                if ask_stop(request["run_id"], run_dir, node, grace, reason):
                    stop_deadline = (time.time() + grace + 10, grace, reason)
                else:  # no supervisor to ask: stopped here, now
                    end_stop(request["run_id"], run_dir, node, grace, reason)
    except (BrokenPipeError, IOError):
        return 0  # the controller went away; the run goes on


@op("run.stop")
def stop(request):
    """Stop the run here: by its supervisor when it lives, else directly. Idempotent;
    a second call with grace 0 turns a graceful stop into an immediate kill."""
    run_id = request["run_id"]
    run_dir = _run_dir(request)
    node = node_or_fail(run_dir, run_id)
    grace = float(request.get("grace", 10))
    reason = request.get("reason") or "stopped"
    node_path = os.path.join(run_dir, "node.json")
    if ask_stop(run_id, run_dir, node, grace, reason):
        deadline = time.time() + grace + 10
        while time.time() < deadline:
            node = run_files.read_json(node_path, node) or node
            if node.get("state") in run_files.FINAL_STATES:
                break
            time.sleep(0.05)
    return end_stop(run_id, run_dir, node, grace, reason, reply=True)
