"""The parameter-server part of a node's supervisor: start each server and trainer of
this host, and judge the node by its trainers (paddle's own launcher cannot be trusted
to: it exits 0 when every trainer crashed and never stops its servers).

- a trainer that fails ends the node at once (the controller then ends every host);
- a server that exits while trainers still run ends the node too: they would wait on
  it forever;
- once every trainer of this host exited 0 the node says ``serving`` in node.json; the
  controller stops the servers when every host says so, and the node has succeeded.
Every trainer's end is in its rank.<N>.json, every server's in node.json's ``servers``
(index, pid, start, exit code or signal, end), and the server that failed the node in
``server_failed`` with its last lines: the controller names it, not the trainers that
died after it. Stdlib only, Python 3.6+.
"""
import os
import subprocess
import time

from . import files as run_files


def start_roles(sup, argv, env, cwd):
    """One process per role in spec["roles"], all in one new process group."""
    group = []

    def join_group():
        os.setpgid(0, group[0] if group else 0)

    sup.servers = {}
    records = []
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
            records.append({"local_rank": role["local"], "rank": role["index"], "pid": proc.pid,
                            "started": time.time(), "ended": None, "exit_code": None,
                            "signal": None, "log": role["log"]})
            continue
        sup.children[proc.pid] = role["local"]
        run_files.write_json(os.path.join(sup.run_dir, "rank.%d.json" % role["local"]), {
            "local_rank": role["local"], "rank": role["index"], "pid": proc.pid,
            "started": time.time(), "ended": None, "exit_code": None, "signal": None})
    sup.node["servers"] = records   # written with the node's "running" record


def trainers(sup):
    return [pid for pid, local in sup.children.items() if local is not None]


def record_server_ends(sup):
    """Each server's exit into node.json's ``servers``, once, as it is reaped."""
    changed = False
    for record in sup.node.get("servers") or ():
        if record["ended"] is None and record["pid"] in sup.exits:
            record["exit_code"], record["signal"], record["ended"] = sup.exits[record["pid"]]
            changed = True
    return changed


def check(sup):
    """Each turn of the supervisor's loop: a server's end recorded; a server gone early,
    or every trainer done."""
    if record_server_ends(sup):
        sup.record()
    if sup.stop_asked is not None:
        return
    mine = trainers(sup)
    done = [pid for pid in mine if pid in sup.exits]
    for record in sup.node.get("servers") or ():
        if record["ended"] is not None and len(done) < len(mine):
            code, sig = record["exit_code"], record["signal"]
            how = "signal %d" % sig if sig else "code %s" % code
            sup.stop_asked = time.time()
            sup.node["stop_reason"] = "server %d exited (%s) while trainers ran" % (
                record["rank"], how)
            failed = dict(record)
            failed["tail"] = run_files.tail_lines(
                os.path.join(sup.run_dir, "log", record["log"]), 20)
            sup.record(server_failed=failed)
            return
    if len(done) == len(mine) and not sup.node.get("serving"):
        if all(not (sup.exits[pid][0] or sup.exits[pid][1]) for pid in done):
            sup.record(serving=time.time())


def outcome(sup):
    """(state, exit_code, signal) by the trainers and the server that failed the node, if
    any: the first failure by time; none before a stop from outside (the controller's
    teardown after another host failed, Ctrl-C) and the node was stopped; servers
    stopped after every trainer finished are no failure. (The servers' last ends go
    into the final record.)"""
    record_server_ends(sup)
    exits = [sup.exits[pid] for pid in trainers(sup) if pid in sup.exits]
    failed = [(e[2], e[0], e[1]) for e in exits if e[0] or e[1]]
    server = sup.node.get("server_failed")
    if server:
        failed.append((server["ended"], server["exit_code"], server["signal"]))
    outside = sup.stopped_from_outside
    if failed:
        when, code, sig = min(failed, key=lambda f: f[0])
        return ("stopped" if outside is not None and when >= outside else "failed"), code, sig
    if len(exits) == len(trainers(sup)):
        return "succeeded", 0, None
    return ("stopped" if outside is not None else "failed"), None, None
