"""One rank of a run, between its launcher and the training script. Stdlib only, Python
3.6+, and standalone: the prepare step copies this file into the run directory, and the
launcher runs ``python -S <run_dir>/rankwrap.py <run_dir> CMD...`` once per local rank,
with LOCAL_RANK (and RANK) in the environment: torchrun with ``--no-python``; paddle's
launcher because it runs a "training script" that does not end in .py as it is given,
with PADDLE_LOCAL_RANK (and PADDLE_TRAINER_ID).

It sends the rank's stdout and stderr to ``log/workerlog.<LOCAL_RANK>``, starts CMD as its
child, and records ``rank.<LOCAL_RANK>.json`` (pid, start, exit status, end time): the
exact exit of every rank, whatever launcher ran it, is what names a failure's root cause.
It then leaves with the child's own status (the same signal, or the same exit code), so
the launcher above sees what it would have seen without it.

Signals: launchers (torchrun, paddle's) and multihost signal whole process groups, so
the child gets them directly; this wrapper only waits for it and never forwards (a
training script's SIGTERM handler would otherwise run twice).
"""
import json
import os
import signal
import sys
import time

CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
          signal.SIGUSR2)


def write_json(path, data):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        json.dump(data, out, sort_keys=True)
    os.replace(tmp, path)


def child_env(env, run_dir, local_rank):
    """What the script gets from here: the attempt under torchrun's name (torchrun sets
    TORCHELASTIC_RESTART_COUNT to its own count, 0, for its workers), and the stack hook
    (stackhook/sitecustomize.py: `multihost stacks` without py-spy), taken by the first
    Python process below (the script), not by the interpreters it starts."""
    if env.get("MULTIHOST_RESTART_COUNT"):
        env["TORCHELASTIC_RESTART_COUNT"] = env["MULTIHOST_RESTART_COUNT"]
    hook = os.path.join(run_dir, "stackhook")
    if os.path.isfile(os.path.join(hook, "sitecustomize.py")):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (hook, env.get("PYTHONPATH")) if p)
        env["MULTIHOST_STACKS_FILE"] = os.path.join(run_dir, "stacks.%s" % local_rank)
        env["MULTIHOST_EXIT_FILE"] = exit_mark_path(run_dir, local_rank)
        env.pop("MULTIHOST_STACKS_OWNER", None)


def exit_mark_path(run_dir, local_rank):
    return os.path.join(run_dir, "rank.%s.exiting" % local_rank)


def exit_mark(run_dir, local_rank):
    """When the rank's script began to exit (the stack hook's mark), or None: the time
    its peers may already fail at, so the time its failure is judged by."""
    try:
        with open(exit_mark_path(run_dir, local_rank)) as mark:
            return float(mark.read().strip())
    except (OSError, ValueError):
        return None


def own_start_ticks():
    try:
        with open("/proc/self/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
        return int(raw[raw.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def own_pid_namespace():
    """This process's pid namespace (``pid:[inode]``): inside a container (``run
    --image``) the wrapper's pid is the container's, which the host reads otherwise."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def main(argv):
    if len(argv) < 3:
        sys.stderr.write("usage: rankwrap.py RUN_DIR CMD [ARGS...]\n")
        return 2
    run_dir, command = argv[1], argv[2:]
    local_rank = os.environ.get("LOCAL_RANK") or os.environ.get("PADDLE_LOCAL_RANK")
    if local_rank is None or not local_rank.isdigit():
        sys.stderr.write("multihost: LOCAL_RANK is not set: the launcher template must set it\n")
        return 2
    rank = os.environ.get("RANK") or os.environ.get("PADDLE_TRAINER_ID")
    record_path = os.path.join(run_dir, "rank.%s.json" % local_rank)
    log_fd = os.open(os.path.join(run_dir, "log", "workerlog." + local_rank),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for sig in CAUGHT:  # a Python handler (not SIG_IGN) is reset to default by exec
        signal.signal(sig, lambda *_: None)
    # "wrapper": this process (pid, start ticks): a record left without its end by a
    # wrapper that is gone means the wrapper itself was killed (files.rank_records).
    record = {"local_rank": int(local_rank), "rank": int(rank) if rank and rank.isdigit() else None,
              "started": time.time(), "pid": None, "ended": None, "exit_code": None,
              "signal": None, "wrapper": [os.getpid(), own_start_ticks()],
              "pidns": own_pid_namespace()}
    pid = os.fork()
    if pid == 0:
        for sig in CAUGHT:
            signal.signal(sig, signal.SIG_DFL)
        child_env(os.environ, run_dir, local_rank)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        try:
            os.execvp(command[0], command)
        except OSError as err:
            os.write(2, ("multihost: cannot run %s: %s\n" % (command[0], err.strerror)).encode())
        os._exit(127)
    os.close(log_fd)
    record["pid"] = pid
    write_json(record_path, record)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    record["ended"] = time.time()
    record["exiting"] = exit_mark(run_dir, local_rank)
    if os.WIFSIGNALED(status):
        record["signal"] = os.WTERMSIG(status)
    else:
        record["exit_code"] = os.WEXITSTATUS(status)
    write_json(record_path, record)
    if record["signal"]:
        try:  # Python ignores SIGPIPE and catches SIGINT: die of it as the child did
            signal.signal(record["signal"], signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL, SIGSTOP: no handler to reset
        os.kill(os.getpid(), record["signal"])
        time.sleep(1)  # a signal that does not kill by default (rare): fall through
        return 128 + record["signal"]
    return record["exit_code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
