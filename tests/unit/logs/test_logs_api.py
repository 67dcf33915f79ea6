"""`Run.logs` asks for the lines `multihost logs` would show with the same choices: a
list of ranks reads as `--rank 0,3`, one host or several as `--host`, and a bad choice
is the CLI's own one-line error."""
import pytest

from multihost import Run
from multihost.errors import ConfigError
from multihost.logs import show


def test_run_logs_asks_for_the_same_lines_as_the_flags(monkeypatch):
    asked = []
    monkeypatch.setattr(show, "read_logs", lambda request, say: asked.append(request) or [])
    Run("20261203-101500-3f2a").logs(rank=[0, 3], host="h1", role=["server", "launcher"],
                                     tail=5, grep="loss", since="15m")
    request = asked[0]
    assert (request.run, request.ranks, request.hosts, request.roles) == \
        ("20261203-101500-3f2a", "0,3", ("h1",), ("server", "launcher"))
    assert (request.tail, request.grep, request.since, request.follow) == (5, "loss", "15m", False)


@pytest.mark.parametrize("choice, said", [
    (show.LogsRequest(tail=-1), "--tail must be 0 or more"),
    (show.LogsRequest(grep="(unclosed"), "--grep '(unclosed' is not a valid regex"),
])
def test_a_bad_choice_is_refused_before_any_run_is_looked_up(choice, said):
    with pytest.raises(ConfigError) as err:
        show.line_filter(choice)
    assert err.value.cause.startswith(said)
