"""The root cause is the rank that crashed, not the peer whose collective saw it go."""
from multihost.run.outcome import Failure
from multihost.run.peers import peer_first

# rank 0's last line in the lab when rank 1 (on the other host) crashed at step 25
# (torch 2.13, gloo): its exit was recorded 0.3 s before rank 1's.
GLOO = ("[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
        "pair.cc:553] Connection closed by peer [198.18.0.12]:19590. This is typically caused "
        "by a remote worker crashing. Check the logs of the remote worker before reporting an")
VICTIM = Failure(100.0, 0, "h1", "rank", rank=0, local_rank=0, exit_code=1)
CRASHED = Failure(100.3, 1, "h2", "rank", rank=1, local_rank=0, exit_code=1)


def test_a_rank_that_lost_its_peer_gives_way_to_the_peer_that_crashed():
    assert peer_first(VICTIM, ["step 25", GLOO], [VICTIM, CRASHED]) == CRASHED


def test_a_rank_that_failed_of_its_own_stays_the_root_cause():
    assert peer_first(VICTIM, ["ValueError: bad batch"], [VICTIM, CRASHED]) is None


def test_a_peer_that_failed_much_later_is_not_taken_for_the_cause():
    late = Failure(107.0, 1, "h2", "rank", rank=1, local_rank=0, exit_code=1)
    assert peer_first(VICTIM, [GLOO], [VICTIM, late]) is None
    assert peer_first(VICTIM, [GLOO], [VICTIM]) is None


# On a loaded machine rank 1's crash (os._exit: dated by its wrapper) is recorded after
# the neighbour torchrun ended with SIGTERM and after another victim of its collective.
NEIGHBOUR = Failure(100.1, 0, "h1", "rank", rank=1, local_rank=1, signal=15)
OTHER_VICTIM = Failure(100.2, 1, "h2", "rank", rank=2, local_rank=1, exit_code=1)


def told(tails):
    """What the hosts answer about each failure: itself, and its last lines."""
    return lambda failure: (failure, tails.get(failure.rank, ()))


def test_a_victim_gives_way_to_the_crash_not_to_a_neighbour_ended_by_sigterm_or_another_victim():
    failures = [VICTIM, NEIGHBOUR, OTHER_VICTIM, CRASHED]
    explain = told({2: [GLOO], 1: ["rank 1 crashes at step 30"]})
    assert peer_first(VICTIM, [GLOO], failures, explain) == CRASHED
    # Without the crash heard, a neighbour ended by SIGTERM is never named instead.
    assert peer_first(VICTIM, [GLOO], [VICTIM, NEIGHBOUR], explain) is None


def test_a_rank_ended_by_sigterm_gives_way_to_a_rank_that_failed_of_its_own_right_after():
    first = Failure(100.0, 0, "h1", "rank", rank=0, local_rank=0, exit_code=143)
    assert peer_first(first, ["step 25"], [first, CRASHED], told({})) == CRASHED
    # A rank someone ended with SIGTERM on purpose stays the cause: its peers only lost it.
    assert peer_first(first, ["step 25"], [first, CRASHED], told({1: [GLOO]})) is None
