"""Why a host's status stream broke, as the run's views say it: never an empty ()."""
from multihost.run.status_streams import what_broke


def test_an_error_without_words_still_says_what_happened():
    assert what_broke(EOFError()) == "the connection closed"
    assert what_broke(OSError()) == "the connection failed (OSError)"
    assert what_broke(TimeoutError()) == "no answer in time"
    assert what_broke(OSError(104, "Connection reset by peer")) == "[Errno 104] Connection reset by peer"
