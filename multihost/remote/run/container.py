"""A run inside an image: the engine's command line for one node's launcher (or one
rank), and the end of a run's containers by their label. Stdlib only, Python 3.6+.

``run_argv`` is pure: every fact about the host (the engine, its rootless mode, the
hard limits, the GPUs and their CDI names, /dev/infiniband, the user) comes in
``facts``, gathered once by ``host_facts``; the tests feed it recorded outputs.

Why each flag (docs/containers.md says it for users):
  --network host --ipc host   NCCL/gloo see the host's interfaces; /dev/shm is the
                              host's, not a 64 MB one (NCCL's shared memory transport)
  --init                      an init reaps the launcher's orphans and forwards signals
                              (podman refuses it with --pid host, so the container has
                              its own pid namespace; the host still sees every process
                              and its environment, which is how the supervisor finds
                              and stops the run's processes by their marker)
  --user UID:GID              files in the code and run directories stay the user's
  --ulimit memlock, nofile,   RDMA pins memory; an engine's defaults above the host's
    nproc                     hard limit make the container fail to start
  GPUs                        the job's devices, named by UUID inside, so a rank's
                              cuda:N is the same physical GPU as without an image
  /dev/infiniband, IPC_LOCK   RDMA verbs need the devices and the right to pin memory
  -v DIR:DIR                  the code and the run directory at the same paths: the
                              launch request, the logs and the rank wrapper use them
  --label multihost.run=RUN   every container of a run is found on a host, and ended
"""
import json
import os
import shutil
import subprocess

LABEL_RUN = "multihost.run"
LABEL_NODE = "multihost.node"
LABEL_OWNER = "multihost.owner"
ENGINES = ("podman", "docker")
NOFILE_WANTED = 1048576     # what NGC images' docs ask for; capped by the hard limit
# podman's own default for root (4194304) is above most hosts' hard limit, and a host
# without CAP_SYS_RESOURCE cannot raise it: podman hands its conmon 32768 at most.
NPROC_WANTED = 32768
UNLIMITED = -1
INFO_FRESH = 600            # s: a run's check, image step and launch are minutes apart


class ContainerError(Exception):
    """One line, with the fix that works when typed on the host."""

    def __init__(self, text, fix):
        Exception.__init__(self, text)
        self.text = text
        self.fix = fix


# --- reading what the host's tools print (pure) ---------------------------------------
def parse_engine_info(engine, text):
    """{"engine", "version", "rootless"} from ``podman info --format json`` or
    ``docker info --format '{{json .}}'``."""
    try:
        info = json.loads(text)
    except ValueError:
        info = {}
    if engine == "podman":
        version = (info.get("version") or {}).get("Version") or ""
        rootless = bool(((info.get("host") or {}).get("security") or {}).get("rootless"))
    else:
        version = info.get("ServerVersion") or ""
        rootless = any("rootless" in str(o) for o in info.get("SecurityOptions") or ())
    return {"engine": engine, "version": version, "rootless": rootless}


def parse_nvidia_smi_list(text):
    """[(index, uuid)] from ``nvidia-smi -L``: 'GPU 0: NVIDIA H200 (UUID: GPU-...)'."""
    gpus = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line.startswith("GPU ") or "(UUID: " not in line:
            continue   # MIG lines are indented under their GPU: a GPU is passed whole
        index = line[4:].split(":", 1)[0]
        uuid = line.rsplit("(UUID: ", 1)[1].rstrip(")").strip()
        if index.isdigit():
            gpus.append((int(index), uuid))
    return gpus


def parse_cdi_list(text):
    """The nvidia.com/gpu device names of ``nvidia-ctk cdi list`` (one per line, after
    an 'INFO[...] Found N CDI devices' line)."""
    return sorted(word for line in (text or "").splitlines() for word in line.split()
                  if word.startswith("nvidia.com/gpu="))


# --- the command line (pure) -----------------------------------------------------------
def _limit(wanted, hard):
    """A ulimit pair within the host's hard limit: an engine that asks for more cannot
    start the container (setrlimit: Operation not permitted)."""
    if hard == UNLIMITED:
        value = wanted
    elif wanted == UNLIMITED:
        value = hard
    else:
        value = min(wanted, hard)
    return "%s:%s" % (value, value)


def gpu_flags(facts, visible):
    """(engine flags, the CUDA_VISIBLE_DEVICES the job gets inside): the devices the job
    uses on the host (``visible``: the host's CUDA_VISIBLE_DEVICES, None for all), named
    by UUID inside so the order, and a rank's cuda:N, are the host's."""
    gpus = facts.get("gpus") or []
    if not gpus:
        return [], None
    by_index = dict(gpus)
    if visible is None or visible.strip() == "":
        chosen = [index for index, _ in gpus]
    else:
        chosen = []
        for word in visible.split(","):
            word = word.strip()
            if word.isdigit() and int(word) in by_index:
                chosen.append(int(word))
            elif word:
                raise ContainerError(
                    "GPU %s of CUDA_VISIBLE_DEVICES is not one of this host's (%s)"
                    % (word, ",".join(str(i) for i, _ in gpus)),
                    "give --gpus with this host's indices (nvidia-smi -L lists them)")
    if not chosen:
        return [], None
    uuids = [by_index[i] for i in chosen]
    if facts["engine"] == "docker":
        # One value with commas: docker reads --gpus as CSV, so the list is quoted.
        flags = ["--gpus", '"device=%s"' % ",".join(str(i) for i in chosen)]
    else:
        cdi = set(facts.get("cdi") or ())
        flags = []
        for index, uuid in zip(chosen, uuids):
            for name in ("nvidia.com/gpu=%s" % uuid, "nvidia.com/gpu=%d" % index):
                if name in cdi:
                    flags += ["--device", name]
                    break
            else:
                raise ContainerError(
                    "podman has no CDI device for GPU %d (no nvidia.com/gpu=%d in "
                    "`nvidia-ctk cdi list`)" % (index, index),
                    "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    return flags, ",".join(uuids)


def container_name(run_id, node_rank, attempt=0, local_rank=None):
    name = "mh-%s" % run_id
    if attempt:
        name += "-a%d" % int(attempt)
    name += "-n%s" % node_rank
    if local_rank is not None:
        name += "-r%s" % local_rank
    return name


def run_argv(facts, job, argv, env_file, names_from_env=()):
    """The engine's command that runs ``argv`` in the image, as one node's launcher (or,
    with ``job["local_rank"]``, one rank). ``job``: image, run_id, node_rank, attempt,
    cwd, run_dir, visible (the host's CUDA_VISIBLE_DEVICES, None for all). The job's
    environment is in ``env_file`` (values never in argv); ``names_from_env`` are the
    variables whose values cannot be written there (a newline) and come from the
    engine client's own environment."""
    engine = facts["engine"]
    local = job.get("local_rank")
    words = [facts.get("path") or engine, "run", "--rm", "--init",
             "--name", container_name(job["run_id"], job["node_rank"], job.get("attempt"), local),
             "--label", "%s=%s" % (LABEL_RUN, job["run_id"]),
             "--label", "%s=%s" % (LABEL_NODE, job["node_rank"]),
             "--label", "%s=%s" % (LABEL_OWNER, facts.get("user") or facts["uid"]),
             "--network", "host", "--ipc", "host",
             "--user", "%d:%d" % (facts["uid"], facts["gid"])]
    if engine == "podman":
        # The image is on the host before the launch (pulled or loaded); a pull here
        # would race the launch deadline. Rootless: the same uid inside as outside.
        words += ["--pull", "never"]
        if facts.get("rootless"):
            words += ["--userns", "keep-id"]
    limits = facts.get("hard_limits") or {}
    words += ["--ulimit", "memlock=" + _limit(UNLIMITED, limits.get("memlock", UNLIMITED)),
              "--ulimit", "nofile=" + _limit(NOFILE_WANTED, limits.get("nofile", NOFILE_WANTED))]
    words += ["--ulimit", "nproc=" + _limit(NPROC_WANTED, limits.get("nproc", NPROC_WANTED))]
    flags, inside = gpu_flags(facts, job.get("visible"))
    words += flags
    if facts.get("infiniband"):
        words += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK"]
    for path in _mounts(job):
        words += ["-v", "%s:%s" % (path, path)]
    words += ["-w", job["cwd"], "--env-file", env_file]
    for name in names_from_env:
        words += ["--env", name]
    if inside:
        words += ["--env", "CUDA_VISIBLE_DEVICES=%s" % inside]
    words.append(job["image"])
    return words + list(argv)


def _mounts(job):
    seen = []
    for path in (job["cwd"], job["run_dir"]) + tuple(job.get("mounts") or ()):
        path = os.path.abspath(path)
        # A directory inside one already mounted is there already.
        if not any(path == p or path.startswith(p.rstrip("/") + "/") for p in seen):
            seen = [p for p in seen if not p.startswith(path.rstrip("/") + "/")] + [path]
    return seen


def env_file_lines(env):
    """(the env file's text, the names it cannot hold): one NAME=VALUE a line, read by
    the engine verbatim (no quoting), so a value with a newline is passed by name."""
    lines, by_name = [], []
    for name in sorted(env):
        value = str(env[name])
        if "\n" in value or "\r" in value or "=" in name:
            by_name.append(name)
        else:
            lines.append("%s=%s" % (name, value))
    return "".join(line + "\n" for line in lines), by_name


# --- the host's facts ----------------------------------------------------------------
def find_engine(wanted=None):
    """The engine's path: ``wanted`` (podman or docker) or the first found."""
    for name in ((wanted,) if wanted else ENGINES):
        path = shutil.which(name)
        if path:
            return name, path
    if wanted:
        raise ContainerError("%s is not installed on this host" % wanted, install_fix(wanted))
    raise ContainerError("no container engine on this host (podman or docker)",
                         install_fix("podman"))


def install_fix(engine):
    """Debian's package of the engine, typed as this user may type it."""
    package = "docker.io" if engine == "docker" else "podman catatonit"
    return "%sapt-get install -y %s" % ("" if os.getuid() == 0 else "sudo ", package)


def _output(argv, timeout=30):
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


def engine_info(engine, path):
    fmt = ["--format", "json"] if engine == "podman" else ["--format", "{{json .}}"]
    text = _output([path, "info"] + fmt)
    if text is None:
        raise ContainerError("`%s info` fails on this host" % engine,
                             "run `%s info` there and fix what it says" % engine)
    return parse_engine_info(engine, text)


def _info_key(path):
    """What the engine's info depends on: its binary (an upgrade changes it) and the user
    (rootless or not); the storage and GPUs are read afresh every time."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return [path, stat.st_mtime, stat.st_size, os.getuid()]


def remembered_engine_info(engine, path, now=None):
    """``engine_info``, asked once for a run's check, image step and launch: ``podman
    info`` takes a second or more on a busy host, and a run asked it up to three times.
    An answer stays good for INFO_FRESH seconds in ~/.multihost (the user's own)."""
    import time
    from .files import read_json, root_dir, write_json

    now = time.time() if now is None else now
    key = _info_key(path)
    try:
        memo = os.path.join(root_dir(make=True), "engine-info.json")
    except OSError:
        memo = None
    kept = read_json(memo, {}) if memo else {}
    if key and isinstance(kept, dict) and kept.get("key") == key \
            and 0 <= now - float(kept.get("at") or 0) < INFO_FRESH and kept.get("info"):
        return dict(kept["info"])
    info = engine_info(engine, path)
    if memo and key:
        try:
            write_json(memo, {"key": key, "at": now, "info": info})
        except OSError:
            pass   # a full or read-only home: asked again next time
    return info


def host_facts(wanted=None):
    import pwd
    import resource

    engine, path = find_engine(wanted)
    facts = remembered_engine_info(engine, path)
    facts["path"] = path
    facts["uid"], facts["gid"] = os.getuid(), os.getgid()
    try:
        facts["user"] = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        facts["user"] = str(os.getuid())
    limits = {}
    for name, which in (("memlock", resource.RLIMIT_MEMLOCK),
                        ("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(which)[1]
        limits[name] = UNLIMITED if hard == resource.RLIM_INFINITY else int(hard)
    facts["hard_limits"] = limits
    facts["infiniband"] = os.path.isdir("/dev/infiniband")
    smi = shutil.which("nvidia-smi")
    facts["gpus"] = parse_nvidia_smi_list(_output([smi, "-L"])) if smi else []
    ctk = shutil.which("nvidia-ctk")
    facts["cdi"] = parse_cdi_list(_output([ctk, "cdi", "list"])) if ctk and facts["gpus"] else []
    return facts


# --- images ---------------------------------------------------------------------------
def image_id(path, image):
    """The image's id (the digest of its config: the same after a pull, a save | load),
    or None when the host does not have it."""
    text = _output([path, "image", "inspect", "--format", "{{.Id}}", image])
    if not text or not text.strip():
        return None
    value = text.strip().splitlines()[0]
    return value if value.startswith("sha256:") else "sha256:" + value


# --- the end of a run's containers ------------------------------------------------------
def run_containers(path, run_id, runner=_output):
    """The ids of the run's containers on this host, running or not."""
    text = runner([path, "ps", "-a", "-q", "--filter", "label=%s=%s" % (LABEL_RUN, run_id)])
    return [word for word in (text or "").split() if word]


def remove_run_containers(path, run_id, runner=_output):
    """Kill and remove every container of the run here; the ids that were there. Safe
    to call when there are none, and twice."""
    ids = run_containers(path, run_id, runner)
    if ids:
        runner([path, "kill"] + ids)   # fails for the ones already stopped: rm ends them
        runner([path, "rm", "-f"] + ids)
    return ids


def leftovers(path, runner=_output):
    """[{id, name, run, owner, status}] of every multihost container on this host."""
    text = runner([path, "ps", "-a", "--filter", "label=%s" % LABEL_RUN, "--format",
                   "{{.ID}}\t{{.Names}}\t{{.Status}}\t{{.Labels}}"])
    found = []
    for line in (text or "").splitlines():
        parts = line.split("\t")
        if len(parts) < 4:
            continue
        labels = _labels(parts[3])
        found.append({"id": parts[0], "name": parts[1], "status": parts[2],
                      "run": labels.get(LABEL_RUN, ""), "owner": labels.get(LABEL_OWNER, "")})
    return found


def _labels(text):
    """docker prints labels as k=v,k=v; podman as map[k:v k:v]."""
    text = text.strip()
    pairs = {}
    if text.startswith("map[") and text.endswith("]"):
        for word in text[4:-1].split():
            key, _, value = word.partition(":")
            pairs[key] = value
    else:
        for word in text.split(","):
            key, _, value = word.partition("=")
            pairs[key.strip()] = value
    return pairs
