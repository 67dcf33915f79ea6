"""A run's --name stands where its id does: `logs --follow bert-large`, `stop bert-large`."""
import dataclasses

import pytest

from multihost.errors import ConfigError
from multihost.hosts import Host
from multihost.run import records as runs
from multihost.registry.entry import check_name


def saved(run_id, name):
    host = Host("10.0.0.1", rank=0)
    node = runs.NodeRecord(0, runs.host_to_dict(host), host.label, host.name, 1, 0)
    runs.save_run(runs.RunRecord(run_id, 1.0, (node,), ("train.py",), "torchrun", "",
                                 name=name))


def test_a_name_resolves_to_the_newest_run_of_that_name(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    saved("20261127-100000-aaaa", "bert-large")
    saved("20261127-110000-bbbb", "bert-large")
    saved("20261127-120000-cccc", "gpt-small")
    assert runs.resolve_run_id("bert-large") == "20261127-110000-bbbb"
    assert runs.load_run("gpt-small").name == "gpt-small"
    assert runs.resolve_run_id("20261127-10") == "20261127-100000-aaaa"  # a prefix still works
    with pytest.raises(ConfigError, match="no run 'bert'"):
        runs.resolve_run_id("bert")


@pytest.mark.parametrize("name", ["bert large", "-x", "a;rm", "x" * 65, "2026"])
def test_a_name_that_is_not_a_plain_word_is_refused(name):
    with pytest.raises(ConfigError, match="is not a plain word"):
        check_name(name)
