"""--hang-timeout where ranks print steps: a rank (or a run) whose steps stopped is stuck
even while its lines go on; ranks printing no steps keep the line rule."""
from __future__ import annotations

from types import SimpleNamespace

from multihost.events import LogLine, NodeChanged
from multihost.run.hangs import HangWatch
from multihost.run.progress import ProgressWatch

T0 = 1_000_000.0
HOSTS = ("198.18.0.11", "198.18.0.12", "198.18.0.13", "198.18.0.14")


def watch(timeout=20.0):
    said = []
    progress = ProgressWatch(said.append)
    plan = SimpleNamespace(nodes=[SimpleNamespace(host=SimpleNamespace(label=HOSTS[0]))], attempt=0)
    hang = HangWatch(progress, timeout, plan, record=None, cluster=None, mirror=None,
                     steps=progress.last_advance)
    return hang, said


def write(hang, rank, text, t):
    hang(LogLine(rank, HOSTS[rank], 0, rank, text, T0 + t))


def flags(said):
    return [e.detail for e in said if isinstance(e, NodeChanged)]


def test_a_rank_looping_on_a_warning_without_stepping_is_flagged_then_the_run_is_hung():
    hang, said = watch(timeout=20)
    for t in range(0, 60):
        for rank in range(3):
            stepping = t < 5 if rank == 1 else t < 25   # rank 1 stops first, then the others
            write(hang, rank, f"step: {t}" if stepping else "waiting for peers: NCCL timeout soon", t)
        failure = hang.check(T0 + t)
        if failure is not None:
            break
    assert flags(said) == ["rank 1 made no step for 10s while other ranks go on"]
    # Lines never stopped; 20 s after the last step the run is hung, not before.
    assert t == 24 + 20
    assert failure.kind == "hang" and failure.detail.startswith("hung: no rank made a step for 20s")


def test_ranks_without_steps_keep_the_line_rule():
    hang, said = watch(timeout=20)
    for t in range(0, 60):
        for rank in range(3):
            write(hang, rank, f"loading shard {t}", t)      # no step, ever: writing is living
        assert hang.check(T0 + t) is None
    assert flags(said) == []
    assert hang.check(T0 + 59 + 20).detail.startswith("hung: no rank wrote a line for 20s")


def test_a_rank_that_steps_again_is_flagged_again_only_after_a_new_stall():
    hang, said = watch(timeout=40)      # flagged after 20 s
    for t in range(0, 80):
        for rank in range(3):
            stalled = rank == 2 and (5 <= t < 30 or 50 <= t)
            write(hang, rank, "heartbeat" if stalled else f"step: {t}", t)
        hang.check(T0 + t)
    assert flags(said) == ["rank 2 made no step for 20s while other ranks go on"] * 2


def test_ranks_waiting_on_a_stuck_rank_are_not_flagged_the_one_writing_on_is():
    # Rank 0 prints the steps for all (as PaddleSeg does); rank 2 is stuck in a loop that
    # warns, while ranks 0, 1 and 3 wait for it in the collective.
    hang, said = watch(timeout=60)
    for t in range(0, 60):
        if t < 10:
            write(hang, 0, f"step: {t}", t)
        for rank in (1, 3):
            if t == 0:
                write(hang, rank, "starting", t)
        write(hang, 2, "retrying the data loader" if t >= 10 else "loading", t)
        assert hang.check(T0 + t) is None
    assert flags(said) == ["rank 2 writes on while no rank made a step for 30s: "
                           "the others likely wait for it"]


def test_the_launcher_quiet_while_ranks_write_is_never_flagged():
    hang, said = watch(timeout=120)
    hang(LogLine(0, HOSTS[0], -1, -1, "launching 3 ranks", T0))
    for t in range(0, 60):
        for rank in range(3):
            write(hang, rank, f"loading shard {t}", t)
        hang.check(T0 + t)
    assert flags(said) == []
