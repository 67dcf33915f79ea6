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
