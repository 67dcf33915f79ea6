"""Work that only speeds up a later command (multihost/afterwards.py): at once outside a
command that collects it; after the answer inside one; none of it lost to a failure."""
from __future__ import annotations

import pytest

from multihost import afterwards


@pytest.fixture(autouse=True)
def not_collecting():
    yield
    afterwards._pending = None


def test_outside_a_collecting_command_the_work_is_done_at_once():
    done = []
    afterwards.defer(lambda: done.append("snapshot"))
    assert done == ["snapshot"] and not afterwards.pending()


def test_a_collecting_command_does_it_later_in_order_and_a_failure_stops_none():
    done = []
    afterwards.collect()
    afterwards.defer(lambda: done.append(1))
    afterwards.defer(lambda: 1 / 0)
    afterwards.defer(lambda: done.append(3))
    assert done == [] and afterwards.pending()
    afterwards.run_deferred()
    assert done == [1, 3] and not afterwards.pending()
    afterwards.defer(lambda: done.append(4))  # the command is over: at once again
    assert done == [1, 3, 4]
