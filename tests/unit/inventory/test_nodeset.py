from multihost.nodeset import fold


def test_consecutive_addresses_fold_into_a_range():
    assert fold(["198.18.0.11", "198.18.0.12", "198.18.0.13"]) == "198.18.0.[11-13]"


def test_gaps_and_other_prefixes():
    assert fold(["h1", "h2", "h5", "gpu-a"]) == "h[1-2,5],gpu-a"
    assert fold(["node01", "node02", "node10"]) == "node[01-02,10]"


def test_single_and_ipv6_names_stay_as_they_are():
    assert fold(["h7"]) == "h7"
    assert fold(["fe80::1", "fe80::2"]) == "fe80::1,fe80::2"
