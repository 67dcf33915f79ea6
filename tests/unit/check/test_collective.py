"""check --collective, the pure half: nccl-tests' bandwidth arithmetic, the round-robin
schedule of the link test, the verdict, what hosts send, and the three outputs."""
from __future__ import annotations

import io
import itertools
import json

import pytest

from multihost.check.collective import (CollectiveReport, CollectiveRun, HostFacts,
                                        LinkMatrix, SizeRow, collective_to_json, judge,
                                        parse_sizes, round_robin)
from multihost.check.collective_run import parse_links, parse_run
from multihost.errors import ConfigError, RemoteError
from multihost.hosts import Host
from multihost.views.collective_view import render_plain, render_rich

LABELS = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")
MBIT = 1e6


def matrix(rate, slow=None, slow_rate=None, ifaces="eth0"):
    n = len(LABELS)
    rates = [[None if i == j else (slow_rate if slow in (i, j) else rate) * MBIT
              for j in range(n)] for i in range(n)]
    names = [[None if i == j else ifaces for j in range(n)] for i in range(n)]
    return LinkMatrix(LABELS, tuple(map(tuple, rates)), tuple(map(tuple, names)))


HEALTHY_FACTS = [HostFacts("eth0", "eth0", 10000, 0.5, 8)] * 4


# -- bandwidth ------------------------------------------------------------------------
def test_busbw_follows_nccl_tests():
    reduce = SizeRow("all_reduce", 1 << 20, 0.001, 10, ranks=4)
    assert reduce.algbw == pytest.approx((1 << 20) / 0.001)
    assert reduce.busbw == pytest.approx(reduce.algbw * 2 * 3 / 4)
    gather = SizeRow("all_gather", 1 << 20, 0.001, 10, ranks=8)
    assert gather.busbw == pytest.approx(gather.algbw * 7 / 8)
    assert SizeRow("all_reduce", 1024, 0.001, 1, ranks=1).busbw == 0.0


def test_sizes_range_list_and_bad_input():
    assert parse_sizes() == tuple(1024 * 4 ** k for k in range(10))   # 1 KiB .. 256 MiB
    assert parse_sizes("64M,1K") == (1024, 64 << 20)
    assert parse_sizes("1k-16k") == (1024, 4096, 16384)
    for bad in ("1X", "0", "16M-1K", ",", "-"):
        with pytest.raises(ConfigError):
            parse_sizes(bad)


# -- the schedule ---------------------------------------------------------------------
@pytest.mark.parametrize("n", range(2, 18))
def test_round_robin_rounds_are_disjoint_and_meet_every_pair_once(n):
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    met = []
    for peers in rounds:
        for k, peer in enumerate(peers):
            if peer is not None:
                assert peers[peer] == k          # both ends agree: one pair per host
                met.append(tuple(sorted((k, peer))))
    assert sorted(set(met)) == sorted(itertools.combinations(range(n), 2))
    assert len(met) == 2 * len(set(met))         # each pair once (seen from both ends)


# -- the verdict ----------------------------------------------------------------------
def test_healthy_links_have_no_finding():
    assert judge(matrix(940), HEALTHY_FACTS) == ()


def test_a_slow_host_is_named_with_figures_cause_and_fix():
    found = judge(matrix(940, slow=3, slow_rate=190), HEALTHY_FACTS)
    assert [f.label for f in found] == ["10.0.0.4"]
    assert found[0].rank == 3
    assert "190.0 Mbit/s, 20% of the median 940.0 Mbit/s" in found[0].line
    assert "tc qdisc show dev eth0" in found[0].fix


def test_a_host_at_75_percent_is_not_a_finding():
    assert judge(matrix(1000, slow=3, slow_rate=750), HEALTHY_FACTS) == ()


def test_the_likely_cause_comes_from_the_hosts_facts():
    slow = matrix(940, slow=1, slow_rate=90)
    wrong_iface = list(HEALTHY_FACTS)
    wrong_iface[1] = HostFacts("eth1", "ib0", 10000, 0.5, 8)
    cause = judge(slow, wrong_iface)[0]
    assert "left by eth1, but NCCL/GLOO will use ib0" in cause.cause
    assert "iface = eth1" in cause.fix
    slow_nic = list(HEALTHY_FACTS)
    slow_nic[1] = HostFacts("eth0", "eth0", 1000, 0.5, 8)
    assert "runs at 1000 Mb/s, the others at 10000 Mb/s" in judge(slow, slow_nic)[0].cause
    busy = list(HEALTHY_FACTS)
    busy[1] = HostFacts("eth0", "eth0", 10000, 30.0, 8)
    assert "under load (load average 30.0 on 8 CPUs)" in judge(slow, busy)[0].cause


def test_one_slow_link_between_healthy_hosts_is_named_as_the_link():
    base = matrix(940)
    rates = [list(row) for row in base.rates]
    rates[0][2] = rates[2][0] = 100 * MBIT
    found = judge(LinkMatrix(LABELS, tuple(map(tuple, rates)), base.ifaces), HEALTHY_FACTS)
    assert [f.label for f in found] == ["10.0.0.1 <-> 10.0.0.3"]
    assert found[0].rank is None


# -- what hosts send ------------------------------------------------------------------
HOSTS = [Host("10.0.0.1", rank=0), Host("10.0.0.2", rank=1)]


def test_figures_from_the_host_are_checked():
    result = {"torch": "2.4\x1b[31m", "import_s": 1.5, "ops": {"all_reduce": {"rows": [
        {"bytes": 1024, "seconds": 1e-4, "iters": 10},
        {"bytes": 4096, "seconds": float("nan"), "iters": 10},      # dropped
        {"bytes": "lots", "seconds": 1.0, "iters": 1},               # dropped
        {"bytes": -5, "seconds": 1.0, "iters": 1}]}}}                # dropped
    run = parse_run(HOSTS, {0: {"result": result}, 1: {"result": None}}, "gloo", 2, (1024, 4096))
    assert [(r.op, r.bytes) for r in run.rows] == [("all_reduce", 1024)]
    assert "\x1b" not in run.torch and run.error is None
    assert dict(run.timings) == {"import": 1.5}


def test_link_replies_are_checked_cell_by_cell():
    good = {"bytes": 25_000_000, "seconds": 1.0}          # 200 Mbit/s
    replies = {
        0: {"pairs": [{"peer": 1, "iface": "eth0\x1b]52;c;evil\x07", "sent": good,
                       "received": {"bytes": float("inf"), "seconds": 1.0}},
                      {"peer": 7, "sent": good}, {"peer": True, "sent": good}, "junk"],
            "speeds": {"eth0": "fast"}, "load": -3, "cpus": float("nan")},
        1: {"pairs": 42},
    }
    links, facts = parse_links(HOSTS, replies, lambda host: "eth0")
    assert links.rates == ((None, 200e6), (None, None))   # only the one good figure
    assert "\x1b" not in links.ifaces[0][1] and "\x07" not in links.ifaces[0][1]
    assert facts[0].speed_mbit is None and facts[0].load is None and facts[0].cpus is None
    links, _ = parse_links(HOSTS, {0: RemoteError("lost", host="10.0.0.1")}, lambda h: None)
    assert links.errors == ("10.0.0.1: lost", "10.0.0.2: no reply")


def test_a_failed_rank_is_the_error_named_by_host():
    replies = {0: RemoteError("connection lost", host="10.0.0.1"),
               1: {"result": None, "timed_out": False,
                   "failed": [{"exit": 1, "tail": "Traceback\nModuleNotFoundError: torch\n"}]}}
    run = parse_run(HOSTS, replies, "gloo", 2, (1024,))
    assert run.error == "10.0.0.1: connection lost"
    run = parse_run(HOSTS, {0: {"result": None}, 1: replies[1]}, "gloo", 2, (1024,))
    assert run.error == "10.0.0.2: rank exited 1: ModuleNotFoundError: torch"


# -- outputs --------------------------------------------------------------------------
def report(found=True):
    links = matrix(940, slow=3, slow_rate=190) if found else matrix(940)
    run = CollectiveRun("gloo", 4, "2.4.1", (
        SizeRow("all_reduce", 1024, 50e-6, 100, 4), SizeRow("all_reduce", 1 << 20, 0.01, 15, 4),
        SizeRow("all_gather", 1024, 60e-6, 100, 4)), (("all_reduce", 1 << 20),),
        timings=(("import", 1.2),))
    return CollectiveReport(links, run, judge(links, HEALTHY_FACTS), 4.2, link_duration=2.0)


def test_plain_output_has_sizes_matrix_latency_and_the_finding():
    out = io.StringIO()
    render_plain(report(), out)
    text = out.getvalue()
    rows = [line.split() for line in text.splitlines()]
    assert ["all_reduce", "1", "MiB", "10.0", "ms", "0.1049", "0.1573", "15"] in rows
    assert ["3", "10.0.0.4", "190", "190", "190", ".", "190"] in rows
    assert "interface: eth0 on every pair" in text
    assert "small-message latency: all_reduce 1 KiB 50 us, all_gather 1 KiB 60 us" in text
    assert "all_reduce stopped growing after 1 MiB" in text
    assert "SLOW 10.0.0.4: link throughput 190.0 Mbit/s, 20% of the median" in text
    assert text.splitlines()[-1].startswith("collective: NOT ready: 1 slow (4.2s")
    healthy = io.StringIO()
    render_plain(report(found=False), healthy)
    assert "links: no finding" in healthy.getvalue() and "SLOW" not in healthy.getvalue()
    assert healthy.getvalue().splitlines()[-1].startswith("collective: done")


def test_a_slow_finding_gates_like_a_failed_check():
    assert report().ok and not report().ready          # measured, but not ready: exit 3
    assert report(found=False).ready


def test_json_output():
    doc = json.loads(json.dumps(collective_to_json(report())))
    assert doc["ok"] is True and doc["ready"] is False
    assert doc["collective"]["rows"][1]["busbw_GBps"] == pytest.approx(0.157286, abs=1e-6)
    assert doc["links"]["bits_per_s"][3][0] == 190e6
    assert doc["links"]["ifaces"][0][1] == "eth0"
    assert [f["host"] for f in doc["findings"]] == ["10.0.0.4"]
    assert doc["collective"]["capped"] == {"all_reduce": 1 << 20}


def test_rich_output_shows_the_same_rows():
    from rich.console import Console

    console = Console(width=120, color_system=None, force_terminal=True, record=True)
    render_rich(report(), console)
    text = console.export_text()
    assert "busbw GB/s" in text and "0.1573" in text
    assert "SLOW 10.0.0.4" in text and "fix:" in text
