"""What `multihost check` says on a host another run holds, or where a training runs
that multihost did not start: the holder named, and a fix that never stops someone
else's live run."""
import dataclasses
import time

from multihost.check.fixes import actions
from multihost.check.judge import make_survey
from multihost.check.report import FAIL, PASS, WARN
from multihost.job import JobOptions
from test_check_samples import ADDRESSES, lab_probes, report_of, with_facts

RUN = "20261127-110200-ab12"
ME = {"user": "root", "uid": 0}


def hold(user="alice", uid=1001, gpus=None, name="bert-large", ports=(17000, 17001, 17002)):
    return {"kind": "run", "run_id": RUN, "user": user, "uid": uid, "name": name,
            "controller": f"{user}@ctl2", "gpus": gpus, "ports": list(ports), "hosts": [],
            "time": time.time() - 7800, "started": time.time() - 7800, "state": "running",
            "live": True, "pid": 4242}


def judged(entry, job=JobOptions(), gpus_out=None, known=None, n=4):
    probes = lab_probes(n)
    facts = {"holds": {"me": ME, "entries": [entry] if entry else []}}
    if gpus_out:
        facts["gpus"] = {"code": 0, "out": gpus_out, "err": ""}
    probes[1] = with_facts(probes[1], **facts)
    report = report_of(probes, job)
    if known is not None:
        from multihost.check.judge import judge
        from multihost.check.report import CheckReport
        cluster = dataclasses.replace(make_survey(probes, job, 17000, ADDRESSES[0], False),
                                      known_runs=frozenset(known))
        report = CheckReport(judge(cluster), 17000, ADDRESSES[0], None, False)
    return report.hosts[1].result("busy")


def test_another_users_run_is_named_with_a_fix_that_waits_or_goes_elsewhere():
    result = judged(hold(gpus=list(range(8))))
    assert result.status == FAIL
    assert result.detail == f'alice\'s run "bert-large" (run {RUN}, since 2h 10m, GPUs 0-7)'
    assert actions(result.fix) == [("add", "--queue")]
    assert "--exclude 198.18.0.12" in result.fix and "ask alice" in result.fix
    assert "kill" not in result.fix and "multihost stop" not in result.fix


def test_free_gpus_of_a_held_host_are_offered():
    out = "\n".join(f"{i}, NVIDIA H100, 81559, 0, 550.54, GPU-{i}" for i in range(8))
    result = judged(hold(gpus=[0, 1, 2, 3]), JobOptions(gpus=(0, 1, 2, 3)), out)
    assert "use GPUs it leaves free: add `--gpus 4-7 --start-port auto`" in result.fix
    other = judged(hold(gpus=[0, 1, 2, 3], ports=[18000]), JobOptions(gpus=(4, 5, 6, 7)), out)
    assert other.status == PASS and "beside alice's run" in other.detail


def test_ones_own_run_from_this_controller_is_stopped_by_name():
    result = judged(hold(user="root", uid=0), known=[RUN])
    assert result.fix.startswith("stop it: run `multihost stop bert-large`")


def test_ones_own_account_from_another_controller_is_waited_for_first():
    # A shared account: the same uid, but a run this controller did not start.
    result = judged(hold(user="root", uid=0), known=[])
    assert actions(result.fix) == [("add", "--queue")]
    assert "if it is yours" in result.fix and "root@ctl2" in result.fix
    assert "`--allow-concurrent --start-port auto`" in result.fix  # a CPU job may share


def test_a_free_host_passes():
    assert judged(None).status == PASS


def test_a_hand_started_torchrun_is_named_and_not_ready_on_the_jobs_port():
    probes = lab_probes()
    torchrun = {"pid": 777, "uid": 1001, "user": "bob", "tree": [778],
                "command": "/usr/bin/python3 /usr/local/bin/torchrun --nproc_per_node 2 t.py",
                "gpu_uuids": []}
    probes[2] = with_facts(probes[2], foreign=[torchrun], holds={"me": ME, "entries": []})
    result = report_of(probes).hosts[2].result("foreign")
    assert result.status == WARN and "bob's pid 777 (/usr/bin/python3 /usr/local/bin/torchrun" \
        in result.detail
    assert "kill" not in result.fix and "ask bob" in result.fix
    ports = dict(probes[2].facts["ports"], busy=[{"port": 17000, "pid": 778, "command": "x"}])
    probes[2] = with_facts(probes[2], ports=ports)
    held = report_of(probes).hosts[2].result("foreign")
    assert held.status == FAIL and held.detail.endswith("holds port 17000 of this job")
    assert [h.host.rank for h in report_of(probes).hosts if h.result("foreign")] == [2]
