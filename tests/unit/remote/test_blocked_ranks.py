"""A stop's SIGTERM cannot end a rank blocked in a collective its peers left: the
supervisor kills at once when every rank left is in that state, and waits for any that
still does something (a checkpoint being written)."""
import subprocess
import sys
import time

import pytest

from multihost.remote.run.blocked import BlockedRanks, rank_wait

# A stand-in for a torch.distributed rank: a thread named as gloo's, and a main thread
# that either waits on a lock forever (a collective whose peers are gone) or computes.
RANK = r'''
import ctypes, sys, threading, time
def gloo():
    ctypes.CDLL(None).prctl(15, b"pt_gloo_runloop", 0, 0, 0)   # PR_SET_NAME
    threading.Event().wait()
threading.Thread(target=gloo, daemon=True).start()
time.sleep(0.2)
print("up", flush=True)
if sys.argv[1] == "blocked":
    lock = threading.Lock(); lock.acquire(); lock.acquire()
while True:
    sum(range(10000))
'''


@pytest.fixture
def rank():
    started = []

    def start(mode):
        proc = subprocess.Popen([sys.executable, "-c", RANK, mode], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout.readline().strip() == "up"
        return proc
    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def settled(watch, procs, deadline=20.0):
    """Ask as the supervisor does, every 50 ms, until it says kill or the deadline."""
    end = time.time() + deadline
    while time.time() < end:
        if watch.check(procs, time.time()):
            return True
        time.sleep(0.05)
    return False


def test_ranks_all_blocked_in_a_futex_are_given_up_on(rank):
    blocked = [rank("blocked"), rank("blocked")]
    watch = BlockedRanks(settle=0.5)
    assert settled(watch, {p.pid: (p.pid, 0) for p in blocked})
    assert watch.ranks == 2


def test_one_rank_still_computing_keeps_the_wait(rank):
    blocked, busy = rank("blocked"), rank("busy")
    watch = BlockedRanks(settle=0.3)
    assert not settled(watch, {blocked.pid: (blocked.pid, 0), busy.pid: (busy.pid, 0)}, deadline=2.0)
    assert watch.waiting == [busy.pid]


def test_a_process_that_is_not_a_rank_is_left_to_the_kill_wait():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert rank_wait(sleeper.pid) is None
        assert not settled(BlockedRanks(settle=0.2), {sleeper.pid: (sleeper.pid, 0)}, deadline=1.0)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_what_the_stop_waits_for_is_said_with_the_pids_and_the_time_left(rank):
    busy = rank("busy")
    watch = BlockedRanks(settle=0.3)
    watch.check({busy.pid: (busy.pid, 0)}, time.time())
    said = watch.summary(8.6)
    assert said == (f"stop waits for 1 rank pid {busy.pid} still working after SIGTERM "
                    f"(computing); SIGKILL in 9 s")
    assert BlockedRanks().summary(3) == ""
