"""Spare hosts end to end in the lab (issue 14): a host cut mid-run is replaced by a spare
that takes its node rank; without a spare the run ends naming the lost host; a first host
that fails the preflight gives node 0, and so the rendezvous, to a spare.
"""
from __future__ import annotations

import json
import secrets
import sys
import textwrap

import pytest

from test_faults import Controller, fast_lost, found_on, ips, run_argv, up_lines

# Attempt 0: every rank says where it is, then waits (a long job). A later attempt (the
# spare's): every rank says where it is and ends, so the run completes.
SPARE_RANK = textwrap.dedent("""\
    import os, socket, sys, time
    token = sys.argv[1]
    attempt = int(os.environ.get("MULTIHOST_RESTART_COUNT", "0"))
    print("up host=%s rank=%s attempt=%d master=%s" % (
        socket.gethostname(), os.environ["RANK"], attempt, os.environ["MASTER_ADDR"]), flush=True)
    if attempt == 0 and float(sys.argv[2]) > 0:
        time.sleep(float(sys.argv[2]))
""")


@pytest.fixture
def spare_code(tmp_path):
    directory = tmp_path / f"spares-{secrets.token_hex(3)}"   # its own workdir on hosts
    directory.mkdir()
    (directory / "spare_rank.py").write_text(SPARE_RANK)
    return directory


@pytest.fixture
def token() -> str:
    return f"mhspare{secrets.token_hex(4)}"


def kill_leftovers(lab, host: int, token: str) -> None:
    """The processes this test left on a host that was cut (its controller could not stop
    them), ended by pid."""
    for line in found_on(lab, (host,), token).get(host, []):
        lab.host_run(host, ["kill", "-9", line.split()[0]])


def status_of(lab, run_id: str) -> dict:
    return json.loads(lab.multihost("status", run_id, "--json", timeout=60).stdout)


def test_a_host_cut_mid_run_is_replaced_by_a_spare_that_takes_its_rank(lab, spare_code, token):
    controller = Controller(lab, run_argv(lab, spare_code, 3, "--spares", lab.address(4),
                                          "--kill-wait", "1", "--connect-timeout", "3",
                                          "--", "spare_rank.py", token, "300", check=True),
                            env=fast_lost(lab))
    try:
        run_id = controller.run_id()
        up_lines(controller, 3)
        with lab.cut_link(3):
            code = controller.wait(180)
        err = controller.text("err")
        assert code == 0, err[-3000:]
        assert "198.18.0.13 replaced by spare 198.18.0.14 (node 2)" in err, err[-3000:]
        assert "restarting as attempt 2 of 2" in err, err[-3000:]
        # The spare ran node 2's rank, in the same world, with the same rendezvous.
        out = controller.text("out")
        assert "up host=h4 rank=2 attempt=1 master=198.18.0.11" in out, out[-3000:]
        status = status_of(lab, run_id)
        assert status["state"] == "succeeded"
        assert [n["host"] for n in status["nodes"]] == ["198.18.0.11", "198.18.0.12",
                                                         "198.18.0.14"]
        assert status["attempts"][0]["hosts"] == ["198.18.0.11", "198.18.0.12", "198.18.0.13"]
        assert status["replacements"][0]["why"] == "lost"
        shown = lab.multihost("status", run_id, "--plain", timeout=60).stdout
        assert "198.18.0.13 replaced by spare 198.18.0.14 (node 2)" in shown, shown
        # Each attempt's logs still name the hosts that held the ranks then.
        first = lab.multihost("logs", run_id, "--attempt", "1", "--plain", timeout=120).stdout
        second = lab.multihost("logs", run_id, "--attempt", "2", "--plain", timeout=120).stdout
        assert "up host=h3 rank=2 attempt=0" in first, first[-2000:]
        assert "up host=h4 rank=2 attempt=1" in second, second[-2000:]
        # Back on the network, the lost host still runs its old rank: `stop` reaches it.
        assert found_on(lab, (3,), token)
        stopped = lab.multihost("stop", run_id, "--kill-wait", "1", timeout=120)
        assert "198.18.0.13 (lost, replaced by a spare): stopped there too" in stopped.stderr, \
            stopped.stderr
        assert found_on(lab, (3,), token) == {}
    finally:
        controller.kill()
        kill_leftovers(lab, 3, token)
    assert found_on(lab, (1, 2, 4), token) == {}


def test_without_a_spare_a_host_cut_mid_run_ends_the_run_naming_it(lab, spare_code, token):
    controller = Controller(lab, run_argv(lab, spare_code, 3, "--max-restarts", "1",
                                          "--kill-wait", "1", "--connect-timeout", "3",
                                          "--", "spare_rank.py", token, "300", check=True),
                            env=fast_lost(lab))
    try:
        controller.run_id()
        up_lines(controller, 3)
        with lab.cut_link(3):
            code = controller.wait(180)
        err = controller.text("err")
        assert code == 255, err[-3000:]                  # the lost attempt's status
        last = err.strip().splitlines()[-1]
        assert last.startswith("multihost: 198.18.0.13: ") and "was lost" in last, last
        assert "it cannot restart" in last and "(fix: " in last, last
        assert "Traceback" not in err
    finally:
        controller.kill()
        kill_leftovers(lab, 3, token)


def test_a_first_host_that_fails_the_check_gives_node_0_and_the_rendezvous_to_a_spare(
        lab, spare_code, token, tmp_path):
    hosts = tmp_path / "hosts.ini"
    hosts.write_text(f"[{lab.address(1)}]\n[{lab.address(2)}]\n"
                     f"[{lab.address(4)}]\nspare = true\n")
    with lab.cut_link(1):
        result = lab.multihost(
            "run", "--hostfile", str(hosts), "--python", sys.executable, "--launcher", "python",
            "--code", str(spare_code), "--plain", "--connect-timeout", "3",
            "--log_dir", str(tmp_path / "log"), "--", "spare_rank.py", token, "0", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "198.18.0.11 replaced by spare 198.18.0.14 (node 0)" in result.stderr + result.stdout
    # node 0 is the spare: global rank 0 and the rendezvous moved to it.
    assert "up host=h4 rank=0 attempt=0 master=198.18.0.14" in result.stdout, result.stdout
    assert "up host=h2 rank=1 attempt=0 master=198.18.0.14" in result.stdout, result.stdout


def test_a_dead_spare_is_a_warning_in_check_never_not_ready(lab):
    with lab.sshd_stopped(4):
        result = lab.multihost("check", "--ips", ips(lab, 2), "--spares", lab.address(4),
                               "--python", sys.executable, "--plain", "--connect-timeout", "3",
                               timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "warning: spare 198.18.0.14 is not usable" in result.stderr, result.stderr
    assert "spares: 0 of 1 ready" in result.stdout
