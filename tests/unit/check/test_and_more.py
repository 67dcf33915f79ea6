"""An error line that leaves things out names them: never a bare `(and 2 more)`."""
from multihost.errors import and_more
from multihost.hosts import Host
from multihost.machines import refuse_repeats

import pytest

from test_check_samples import lab_probes, report_of, with_facts


def test_the_preflights_error_names_the_other_failures_by_check_and_hosts():
    probes = lab_probes()
    for rank in (1, 2, 3):
        disk = dict(probes[rank].facts["disk"], path="/etc", real="/etc", home="/root")
        probes[rank] = with_facts(probes[rank], disk=disk)
    error = report_of(probes).error()
    assert error.host == "198.18.0.12"
    assert error.cause.endswith(" (and 2 more: workdir on 198.18.0.[13-14])"), error.cause


def test_a_machine_listed_thrice_names_every_repeat():
    hosts = [Host(f"h{i}", rank=i) for i in range(4)]
    from multihost.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        refuse_repeats(hosts, {0: "a", 1: "a", 2: "b", 3: "a"})
    assert "(and 1 more: h3 is h0)" in caught.value.cause


def test_a_long_list_is_cut_after_a_few_names():
    assert and_more([]) == ""
    assert and_more(["a", "b", "c", "d"], 2, unit="runs") == " (and 4 more runs: a, b, ...)"
