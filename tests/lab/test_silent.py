"""Nothing silently wrong (issue 26): a launch that never completed, a host whose python
hangs or whose shell ends early, a full run directory, and what a user names on the
command line, each tried for real in the lab.

Every run here carries its run id in every process it starts, so "nothing left" is
checked on each host's whole process table (test_faults.SCAN).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from test_faults import Controller, found_on, ips, on_host, run_argv, wait_for

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def code(tmp_path: Path) -> Path:
    directory = tmp_path / f"silent-{secrets.token_hex(3)}"   # its own workdir on hosts
    directory.mkdir()
    (directory / "sleeper.py").write_text(SLEEPER)
    return directory


def record_of(lab, run_id: str) -> dict:
    path = lab.home / ".multihost" / "runs" / run_id / "run.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def slow_launch_python(lab, i: int, name: str, seconds: float) -> str:
    """A python for host i whose `run.launch` helper operation starts ``seconds`` late
    (everything else it runs at once): the controller is caught between two launches."""
    path = f"/root/{name}"
    on_host(lab, i, path).write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in *run.launch*) sleep {seconds};; esac
        exec {sys.executable} "$@"
        """))
    on_host(lab, i, path).chmod(0o755)
    return path


# -- 5: a launch either completes on every node or is undone -----------------------------
@pytest.mark.parametrize("launched", [1, 2, 3])
def test_a_controller_killed_mid_launch_leaves_nothing_and_status_says_why(lab, code, tmp_path,
                                                                          launched):
    name = f"slowpy-{secrets.token_hex(3)}"
    lines = []
    for i in range(1, 5):
        lines.append(f"[{lab.address(i)}]")
        # The hosts after the first `launched` are still on their way when it dies.
        python = slow_launch_python(lab, i, name, 12) if i > launched else sys.executable
        lines.append(f"python = {python}")
    hostfile = tmp_path / "hosts.ini"
    hostfile.write_text("\n".join(lines) + "\n")
    argv = run_argv(lab, code, 4, "--launch-timeout", "8")
    argv[argv.index("--ips"):argv.index("--ips") + 2] = ["--hostfile", str(hostfile)]
    del argv[argv.index("--python"):argv.index("--python") + 2]
    controller = Controller(lab, argv + ["--", "sleeper.py"])
    try:
        run_id = controller.run_id()
        wait_for(lambda: sum(n.get("state") == "running"
                             for n in record_of(lab, run_id).get("nodes", [])) >= launched,
                 60, "the first nodes never launched")
        killed = time.monotonic()
        controller.kill()
        assert sum(n.get("state") == "running" for n in record_of(lab, run_id)["nodes"]) == launched
        # Within the bounded time (8 s, the grace, the late launches' 12 s): nothing left.
        wait_for(lambda: not found_on(lab, range(1, 5), run_id), 60,
                 "the run's processes were left on the hosts")
        assert time.monotonic() - killed < 45
        status = lab.multihost("status", run_id, timeout=60)
        assert "launching" not in status.stdout and "running" not in status.stdout, status.stdout
        assert "launch never completed: the controller was lost during the launch" \
            in status.stdout, status.stdout
        assert f"multihost rerun {run_id}" in status.stdout + status.stderr, status.stdout
        data = json.loads(lab.multihost("status", run_id, "--json", timeout=60).stdout)
        assert data["state"] == "stopped"
        assert [n["state"] for n in data["nodes"]] == ["stopped"] * 4
        # The hosts are free again: the next run starts at once.
        after = lab.multihost(*run_argv(lab, code, 4, "--detach"), "--", "sleeper.py", timeout=120)
        assert after.returncode == 0, after.stderr[-2000:]
        assert lab.multihost("stop", "--kill-wait", "1", timeout=60).returncode == 0
    finally:
        controller.kill()
        for i in range(1, 5):
            lab.host_run(i, ["rm", "-f", f"/root/{name}"])
