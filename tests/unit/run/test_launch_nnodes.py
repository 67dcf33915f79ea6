"""--nnodes, typed as torchrun or paddle's launcher take it: multihost starts one node
per host, so a count that is not the host count is refused before launch, with the
command to type instead."""
import argparse

import pytest

from multihost.errors import ConfigError
from multihost.hosts import Host
from multihost.commands.common import job_options_from_args
from multihost.job import check_nnodes

HOSTS = (Host("10.0.0.1", rank=0), Host("10.0.0.2", rank=1))


def test_a_node_count_that_is_not_the_host_count_names_both_and_the_command_without_it():
    typed = ["run", "--ips", "10.0.0.1,10.0.0.2", "--nnodes", "3", "--nproc_per_node", "2",
             "--", "train.py", "--nnodes", "7"]
    with pytest.raises(ConfigError) as err:
        check_nnodes("3", HOSTS, typed)
    assert "--nnodes 3 but 2 hosts given (10.0.0.1, 10.0.0.2)" in str(err.value)
    # the script's own --nnodes (after --) stays: it is the script's
    assert err.value.fix.endswith("`multihost run --ips 10.0.0.1,10.0.0.2 --nproc_per_node 2 "
                                  "-- train.py --nnodes 7`")


def test_the_equals_form_and_an_elastic_range_are_read_as_torchrun_reads_them():
    check_nnodes("2", HOSTS, [])
    check_nnodes("1:4", HOSTS, [])
    with pytest.raises(ConfigError) as err:
        check_nnodes("3:4", HOSTS, ["fleetrun", "--nnodes=3:4", "train.py"])
    assert "give 3 to 4 hosts" in err.value.fix and "`multihost fleetrun train.py`" in err.value.fix


def test_a_count_that_is_not_a_number_is_refused_with_the_host_count():
    with pytest.raises(ConfigError) as err:
        check_nnodes("two", HOSTS, [])
    assert "leave --nnodes out" in err.value.fix and "(2 here)" in err.value.fix


def test_the_job_options_check_it_against_the_hosts_given():
    args = argparse.Namespace(gpus=None, nproc_per_node=None, nnodes="1")
    with pytest.raises(ConfigError):
        job_options_from_args(args, HOSTS)
    job_options_from_args(argparse.Namespace(gpus=None, nproc_per_node=None, nnodes="2"), HOSTS)
