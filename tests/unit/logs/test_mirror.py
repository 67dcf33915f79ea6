"""Reading the controller's log mirror with the filters of `multihost logs`."""
import re

import pytest

from multihost.errors import ConfigError
from multihost.hosts import Host
from multihost.logs.mirror_layout import nodes_of, times_path
from multihost.logs.mirror import LineFilter, parse_ranks, parse_since, read_mirror

HOSTS = [Host(name="198.18.0.11", rank=0), Host(name="198.18.0.12", rank=1)]


@pytest.fixture
def mirror(tmp_path):
    for node, host in enumerate(HOSTS):
        log = tmp_path / host.label / "log"
        log.mkdir(parents=True)
        for local in range(2):
            path = log / f"workerlog.{local}"
            path.write_bytes(b"".join(b"n%d r%d line %d\n" % (node, local, i) for i in range(5)))
            times_path(path).write_text("0 100.0\n26 200.0\n")  # lines 0-1 early, 2-4 late
        (tmp_path / host.label / "launcher.log").write_bytes(b"launcher up\n")
    return tmp_path


def flat(blocks):
    return [line for block in blocks for line in block.split()]


def texts(blocks):
    return [(l.rank, l.text) for l in flat(blocks)]


def test_all_lines_in_rank_order_with_global_ranks(mirror):
    lines = flat(read_mirror(mirror, nodes_of([(h, 2) for h in HOSTS]), LineFilter()))
    assert [l.rank for l in lines] == [-1] + [0] * 5 + [1] * 5 + [-1] + [2] * 5 + [3] * 5
    assert lines[6].text == "n0 r1 line 0" and lines[-1].host == "198.18.0.12"


def test_rank_host_grep_and_tail_filters(mirror):
    nodes = nodes_of([(h, 2) for h in HOSTS])
    assert texts(read_mirror(mirror, nodes, LineFilter(ranks={3}), tail=2)) == \
        [(3, "n1 r1 line 3"), (3, "n1 r1 line 4")]
    assert {l.host for l in flat(read_mirror(mirror, nodes, LineFilter(hosts={"198.18.0.12"})))} == \
        {"198.18.0.12"}
    assert len(flat(read_mirror(mirror, nodes, LineFilter(pattern=re.compile(r"line [34]"))))) == 8
    assert texts(read_mirror(mirror, nodes, LineFilter(ranks={0}), tail=4)) == \
        [(0, f"n0 r0 line {i}") for i in (1, 2, 3, 4)]  # across two arrival chunks


def test_since_uses_the_arrival_times(mirror):
    nodes = nodes_of([(HOSTS[0], 2)])
    late = read_mirror(mirror, nodes, LineFilter(ranks={0}, since=150.0))
    assert texts(late) == [(0, f"n0 r0 line {i}") for i in (2, 3, 4)]


def test_since_and_ranks_parsing():
    assert parse_since("15m", now=1000.0) == 100.0
    assert parse_since("2h", now=10000.0) == 2800.0
    assert parse_ranks("0,3-5") == {0, 3, 4, 5}
    with pytest.raises(ConfigError, match="not a duration"):
        parse_since("yesterday", now=0)
    with pytest.raises(ConfigError, match="not a rank"):
        parse_ranks("0,x")


def test_latest_names_the_newest_run_and_each_rank_by_its_global_rank(tmp_path):
    from multihost.logs.mirror_layout import link_latest

    for run in ("run-a", "run-b"):
        mirror = tmp_path / run
        for host in HOSTS:
            log = mirror / host.label / "log"
            log.mkdir(parents=True)
            for local in range(2):
                (log / f"workerlog.{local}").write_text(f"{run} {host.label} local {local}\n")
        latest = link_latest(mirror, nodes_of([(h, 2) for h in HOSTS]))
    assert latest == tmp_path / "latest"
    assert (latest / "workerlog.3").read_text() == "run-b 198.18.0.12 local 1\n"
    assert (latest / "workerlog.0").read_text() == "run-b 198.18.0.11 local 0\n"
    # the link follows the mirror file as it grows, as `tail -f` needs
    with open(tmp_path / "run-b" / "198.18.0.12" / "log" / "workerlog.1", "a") as grow:
        grow.write("step 2\n")
    assert (latest / "workerlog.3").read_text().endswith("step 2\n")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_latest_names_the_newest_attempt_of_a_restarted_run(tmp_path):
    from multihost.logs.mirror_layout import link_latest

    for attempt in (0, 1):
        mirror = tmp_path / "run-a" / f"attempt_{attempt}"
        log = mirror / HOSTS[0].label / "log"
        log.mkdir(parents=True)
        (log / "workerlog.0").write_text(f"attempt {attempt}\n")
        latest = link_latest(mirror, nodes_of([(HOSTS[0], 1)]))
    assert latest == tmp_path / "latest"       # where `tail -f log/latest/workerlog.0` looks
    assert (latest / "workerlog.0").read_text() == "attempt 1\n"


def test_two_hosts_parameter_servers_are_labelled_by_their_index_across_the_job(tmp_path):
    from multihost.events import LogBlock
    from multihost.logs.mirror import LineFilter, read_mirror
    from multihost.run.fleetrun import build_layout

    for host in HOSTS[:2]:          # each host's first server writes its serverlog.0
        log = tmp_path / host.label / "log"
        log.mkdir(parents=True)
        (log / "serverlog.0").write_text(f"serving on {host.label}\n")
    shown = [b.who for b in read_mirror(tmp_path, nodes_of([(h, 1) for h in HOSTS[:2]]),
                                        LineFilter()) if isinstance(b, LogBlock)]
    assert shown == ["198.18.0.11 [server 0]", "198.18.0.12 [server 1]"]
    # the live view numbers them from the job's layout, the same way
    layout = build_layout(("per_machine", 1, 1, None), ["198.18.0.11", "198.18.0.12"], 17000)
    assert layout.first_servers() == (0, 1)
