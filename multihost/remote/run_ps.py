"""The parameter-server part of a node's supervisor: start each server and trainer of
this host, and judge the node by its trainers (paddle's own launcher cannot be trusted
to: it exits 0 when every trainer crashed and never stops its servers).

- a trainer that fails ends the node at once (the controller then ends every host);
- a server that exits while trainers still run ends the node too: they would wait on
  it forever;
- once every trainer of this host exited 0 the node says ``serving`` in node.json; the
  controller stops the servers when every host says so, and the node has succeeded.
Stdlib only, Python 3.6+.
"""
import os
import subprocess
import time

from . import run_files


def start_roles(sup, argv, env, cwd):
    """One process per role in spec["roles"], all in one new process group."""
    group = []

    def join_group():
        os.setpgid(0, group[0] if group else 0)

    sup.servers = {}
    os.makedirs(os.path.join(sup.run_dir, "gloo"), exist_ok=True)  # PADDLE_GLOO_FS_PATH
    for role in sup.spec["roles"]:
        role_env = dict(env)
        role_env.update(role["env"])
        log = open(os.path.join(sup.run_dir, "log", role["log"]), "ab", 0)
        proc = subprocess.Popen(argv, cwd=cwd, env=role_env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, close_fds=True,
                                preexec_fn=join_group)
        log.close()
        group.append(proc.pid)
        if role["role"] == "server":
            sup.servers[proc.pid] = role["local"]
            sup.children[proc.pid] = None
            continue
        sup.children[proc.pid] = role["local"]
        run_files.write_json(os.path.join(sup.run_dir, "rank.%d.json" % role["local"]), {
            "local_rank": role["local"], "rank": role["index"], "pid": proc.pid,
            "started": time.time(), "ended": None, "exit_code": None, "signal": None})


def trainers(sup):
    return [pid for pid, local in sup.children.items() if local is not None]


def check(sup):
    """Each turn of the supervisor's loop: a server gone early, or every trainer done."""
    if sup.stop_asked is not None:
        return
    mine = trainers(sup)
    done = [pid for pid in mine if pid in sup.exits]
    for pid, local in sorted(sup.servers.items()):
        if pid in sup.exits and len(done) < len(mine):
            code, sig, when = sup.exits[pid]
            how = "signal %d" % sig if sig else "code %s" % code
            sup.stop_asked = time.time()
            sup.node["stop_reason"] = "server %d exited (%s) while trainers ran" % (local, how)
            sup.node["server_failed"] = {"local": local, "exit_code": code, "signal": sig,
                                         "time": when}
            return
    if len(done) == len(mine) and not sup.node.get("serving"):
        if all(not (sup.exits[pid][0] or sup.exits[pid][1]) for pid in done):
            sup.record(serving=time.time())


def outcome(sup):
    """(state, exit_code, signal) by the trainers: servers stopped after every trainer
    finished are not a failure."""
    exits = [sup.exits[pid] for pid in trainers(sup) if pid in sup.exits]
    failed = sorted((e for e in exits if e[0] or e[1]), key=lambda e: e[2])
    if failed:
        return "failed", failed[0][0], failed[0][1]
    if len(exits) == len(trainers(sup)):
        return "succeeded", 0, None
    server = sup.node.get("server_failed")
    outside = sup.stopped_from_outside
    if server and (outside is None or server["time"] < outside):
        return "failed", server["exit_code"], server["signal"]
    return ("stopped" if outside is not None else "failed"), None, None
