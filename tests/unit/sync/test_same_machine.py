"""One machine listed twice is refused by every command through one function
(multihost/machines.py): by address before any host is reached, else as the machines
say (boot id and network namespace)."""
import pytest

from multihost.errors import ConfigError
from multihost.hosts import Host
from multihost.machines import by_address, refuse_repeats, repeats


def test_later_entries_on_a_machine_already_listed_are_named_with_the_first():
    assert repeats({0: "b1/net:[1]", 1: "b1/net:[2]", 2: "b1/net:[1]", 3: None, 4: "-"}) == {2: 0}


def test_the_refusal_names_both_entries_and_a_fix_that_drops_the_second():
    hosts = [Host(rank=0, name="198.18.0.11"), Host(rank=1, name="h1")]
    with pytest.raises(ConfigError) as refused:
        refuse_repeats(hosts, {0: "b/net:[1]", 1: "b/net:[1]"})
    assert refused.value.cause.startswith("h1 is the same machine as 198.18.0.11 (rank 0)")
    assert "--exclude h1" in refused.value.fix


def test_two_names_of_one_address_are_one_machine_before_any_host_is_reached():
    hosts = [Host(rank=0, name="127.0.0.1"), Host(rank=1, name="localhost", port=22),
             Host(rank=2, name="127.0.0.1", port=2222)]
    found = by_address(hosts)
    assert found[0] == "127.0.0.1:22" and found[2] == "127.0.0.1:2222"
    assert repeats(found) in ({}, {1: 0})   # localhost may resolve to ::1 first
