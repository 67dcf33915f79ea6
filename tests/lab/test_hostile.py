"""A hostile host, end to end in the lab: after a real run, host 1's installed helper is
replaced by one that answers with log frames naming absolute and `..` paths, malformed
frames, forged status records and terminal escapes (OSC 52 clipboard writes, OSC 0 window
titles). Nothing outside the run's mirror may change on the controller, no escape may
reach the user's terminal, and every refusal is one line naming the host.

The controller's files are snapshotted from outside multihost (hashes of every file under
its HOME), so the assertions never go through the code under test.
"""
from __future__ import annotations

import hashlib
import json
import secrets
import sys
from pathlib import Path

from multihost.helper import helper_id

JOB = 'import os\nprint("rank %s ready" % os.environ["RANK"], flush=True)\n'
OSC = "\x1b]52;c;cm0gLXJmIH4K\x07\x1b]0;owned\x07\x1b[2J"

# The helper host 1 runs instead of ours. Each `logs.tail` call plays the next attack
# (a counter beside it), after one good frame of escapes; `run.status` answers a forged
# record; anything else fails with escapes in its error text.
HOSTILE = r'''
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
op, request = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
out = sys.stdout.buffer
OSC = %(osc)r
if op == "logs.tail":
    counter = os.path.join(here, "attack")
    attack = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(attack + 1))
    offset = request.get("offsets", {}).get("log/workerlog.0", 0)
    good = ("evil line " + OSC + "\n").encode()
    out.write(b"D log/workerlog.0 %%d %%d\n" %% (offset, len(good)) + good)
    bad = ATTACKS[attack %% len(ATTACKS)].encode()
    out.write(bad)
    out.write(b'E {"state": "succeeded", "exit_code": 0}\n')
elif op == "run.status":
    out.write(json.dumps({"ok": True, "result": {
        "state": "failed" + OSC, "detail": "forged\n" + OSC, "procs": "lots",
        "node": {"state": "failed", "exit_code": "1; rm -rf ~", "started": "now"},
        "ranks": [{"local_rank": 0, "exit_code": 1}, "junk"],
        "tails": {"0": ["Traceback" + OSC, 42]}, "launcher_tail": [OSC]}}).encode() + b"\n")
else:
    out.write(json.dumps({"ok": False, "error": "refused " + OSC,
                          "fix": "obey " + OSC}).encode() + b"\n")
    sys.exit(1)
'''


def attacks(canary: Path, token: str):
    """Frames each trying to write outside the mirror, or to break the stream."""
    up = "../" * 30
    size = canary.stat().st_size
    return [
        f"D {canary} {size} 6\nowned\n",                            # append to a HOME file
        f"D {up}{str(canary)[1:]} {size} 6\nowned\n",               # the same through ..
        f"D /tmp/{token} 0 6\nowned\n",                              # a new file anywhere
        f"D log/../../../{token} 0 6\nowned\n",                      # beside the mirror
        "D log/workerlog.0 zero 6\nowned\n",                         # a malformed header
        "Z log/workerlog.0 0 5000 6\nowned\n",                       # a damaged packed frame
        "S {not json\n",                                             # a broken record
    ]


def snapshot(top: Path, skip) -> dict:
    files = {}
    for path in sorted(top.rglob("*")):
        if path.is_file() and not any(path.is_relative_to(s) for s in skip):
            files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def no_escape(text: str) -> bool:
    return not any(c in text for c in "\x1b\x07\x9b\x9d")


def test_a_hostile_host_writes_nothing_outside_the_mirror_and_reaches_no_terminal(lab, tmp_path):
    token = "mhhostile" + secrets.token_hex(4)
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(JOB)
    log_dir = tmp_path / "log"
    ran = lab.multihost("run", "--ips", lab.address(1), "--python", sys.executable,
                        "--launcher", "python", "--nproc_per_node", "1", "--code", str(code),
                        "--no-check", "--plain", "--log_dir", str(log_dir), "--", "job.py",
                        cwd=code, timeout=180)
    assert ran.returncode == 0, ran.stderr[-2000:]
    run_id = (lab.home / ".multihost" / "last").read_text().strip()
    helper = lab.lab.paths.host_root(1) / ".cache" / "multihost" / f"helper-{helper_id()}"
    assert (helper / "__main__.py").is_file()

    canary = lab.home / f"{token}.canary"
    canary.write_text("the user's own file\n")
    tries = attacks(canary, token)
    real = (helper / "__main__.py").read_bytes()
    (helper / "__main__.py").write_text(f"ATTACKS = {json.dumps(tries)}\n" + HOSTILE % {"osc": OSC})
    try:
        attack_with(lab, code, run_id, tries, canary, token, log_dir / run_id, tmp_path)
    finally:  # the lab is shared by the tests after this one
        (helper / "__main__.py").write_bytes(real)
        (helper / "attack").unlink(missing_ok=True)


def attack_with(lab, code, run_id, tries, canary, token, mirror, tmp_path):
    record = lab.home / ".multihost" / "runs" / run_id   # `status` may update the record
    before = snapshot(lab.home, [record])

    shown = []
    for attack in tries:
        result = lab.multihost("logs", run_id, "--plain", cwd=code, timeout=120)
        shown += [result.stdout, result.stderr]
        assert result.returncode != 0, (attack, result.stderr)
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"multihost: {lab.address(1)}: "), (attack, last)
        assert "(fix: " in last and "Traceback" not in result.stderr, result.stderr
        assert "evil line" in result.stdout  # the good frame before the attack is shown
    for command in (["status", run_id], ["status", run_id, "--json"], ["stop", run_id],
                    ["logs", run_id, "--follow", "--plain"]):
        result = lab.multihost(*command, cwd=code, timeout=120)
        shown += [result.stdout, result.stderr]
        assert "Traceback" not in result.stderr, (command, result.stderr)

    assert all(no_escape(text) for text in shown), [t for t in shown if not no_escape(t)]
    assert snapshot(lab.home, [record]) == before
    assert canary.read_text() == "the user's own file\n"
    assert not list(Path("/tmp").glob(f"{token}*")) and not list(tmp_path.rglob(f"{token}*"))
    host = lab.address(1)
    inside = {str(p.relative_to(mirror)) for p in mirror.rglob("*") if p.is_file()}
    assert inside <= {".multihost-mirror", f"{host}/.lock", f"{host}/log/workerlog.0",
                      f"{host}/log/.workerlog.0.times", f"{host}/launcher.log",
                      f"{host}/.launcher.log.times", "workerlog.0"}, inside
    # rank 0's log by its global rank is multihost's own link, into the host's mirror
    assert (mirror / "workerlog.0").resolve() == (mirror / host / "log" / "workerlog.0").resolve()
