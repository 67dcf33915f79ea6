"""The supervisor's side of a run inside an image (``run --image``): the engine's
command for the launcher or a rank, and the end of the run's containers. Stdlib only.

The engine's client runs as the supervisor's child, in place of the launcher: its exit
is the container's. The job's environment goes to the container through a private env
file, never through the client's own: podman's conmon inherits the client's environment,
and a conmon carrying the run's marker would be taken for one of the run's processes.
"""
import os

from . import container
from . import processes

# Exit statuses the engine's client gives a container whose process died of a signal.
SIGNALLED = range(129, 160)


class ImageRun(object):
    def __init__(self, spec, run_dir, attempt=0):
        box = spec["container"]
        self.spec = spec
        self.run_dir = run_dir
        self.facts = container.host_facts(box.get("engine"))
        self.image = box["image"]
        self.image_id = container.image_id(self.facts["path"], self.image)
        if self.image_id is None:
            raise container.ContainerError(
                "image %s is not on this host" % self.image,
                "multihost run --image %s --image-from-controller (or `%s pull %s` there)"
                % (self.image, self.facts["engine"], self.image))
        wanted = box.get("image_id")
        if wanted and wanted != self.image_id:
            raise container.ContainerError(
                "image %s here is %s, not the run's %s" % (self.image, self.image_id[:19],
                                                          wanted[:19]),
                "multihost run --image %s --image-from-controller" % self.image)
        self.job = {"image": self.image, "run_id": spec["run_id"],
                    "node_rank": spec["node_rank"], "attempt": attempt, "cwd": spec["cwd"],
                    "run_dir": run_dir, "mounts": box.get("mounts") or (),
                    "visible": (spec.get("env") or {}).get("CUDA_VISIBLE_DEVICES")}

    def record(self):
        """What node.json keeps: a later ``stop`` ends the containers without us."""
        return {"engine": self.facts["engine"], "path": self.facts["path"],
                "image": self.image, "image_id": self.image_id,
                "version": self.facts.get("version")}

    def job_env(self, spec):
        """The container's environment: the job's own, not the host's (its PATH, its
        HOME would be wrong inside the image)."""
        return dict(spec.get("env") or {})

    def command(self, argv, env, local_rank=None):
        """(the engine's argv, the client's environment) for ``argv`` with ``env``."""
        job = dict(self.job)
        if local_rank is not None:
            job["local_rank"] = local_rank
        text, by_name = container.env_file_lines(env)
        name = "container.%s.env" % ("node" if local_rank is None else "rank%s" % local_rank)
        path = os.path.join(self.run_dir, name)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            out.write(text)
        client = dict(os.environ)
        for key in list(client):
            if key.startswith("MULTIHOST_"):
                del client[key]
        for key in by_name:
            client[key] = str(env[key])
        return container.run_argv(self.facts, job, argv, path, by_name), client

    def exit_of(self, code, sig):
        """A container whose process died of signal N exits 128+N from the client."""
        if sig is None and code in SIGNALLED:
            return None, code - 128
        return code, sig

    def remove(self):
        return remove_for(self.record(), self.spec["run_id"])


def remove_for(record, run_id):
    """Kill and remove the run's containers on this host, from node.json's record."""
    if not record or not record.get("path"):
        return []
    try:
        return container.remove_run_containers(record["path"], run_id)
    except OSError:
        return []


INITS = ("podman-init", "catatonit", "docker-init", "tini")


def _proc_text(pid, name):
    try:
        with open("/proc/%d/%s" % (pid, name), "rb") as source:
            return source.read().decode("utf-8", "replace")
    except OSError:
        return ""


def innermost_pid(pid):
    """The pid a process has in its own (innermost) namespace: NSpid's last field."""
    for line in _proc_text(pid, "status").splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields else None
    return None


def rank_host_pid(run_id, stacks_path, inner=None):
    """The host's pid of a rank's process inside its container (its records hold the
    pid it has in there): among the run's processes given this rank's stacks file, the
    one whose pid in there is ``inner`` (the stack hook's own word), else, with no word,
    the newest that is not the container's init. None when there is none."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        env = dict(entry.partition("=")[::2] for entry in _proc_text(pid, "environ").split("\0")
                   if entry)
        if env.get(processes.MARKER) != run_id or env.get("MULTIHOST_STACKS_FILE") != stacks_path:
            continue
        if inner is not None:
            if innermost_pid(pid) == inner:
                return pid
            continue
        if _proc_text(pid, "comm").strip() not in INITS:
            found.append(pid)
    return max(found) if found else None
