"""`multihost check --collective` in the lab: every link shaped alike (so the figures are
the network's, not this machine's busy CPUs) shows no finding; one host shaped slower
is named as the slow one. Both runs leave nothing running on any host. Every link is
unshaped again at the end.
"""
from __future__ import annotations

import contextlib
import json
import sys
from typing import Iterator

RATE, SLOW_RATE = "200mbit", "40mbit"
SIZES = "1K-64K"            # quick: the bandwidth of big sizes is the bench's business
# Any process of the check's two jobs, or a job directory, left on a host.
SCAN = r"""
import glob, os
for pid in filter(str.isdigit, os.listdir("/proc")):
    if pid == str(os.getpid()):
        continue
    try:
        cmd = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        continue
    if "collective_bench" in cmd or "linktest.run" in cmd or "collective.run" in cmd:
        print(pid, cmd)
for path in glob.glob("/tmp/multihost-collective-*"):
    print(path)
"""


@contextlib.contextmanager
def shaped(lab, rates) -> Iterator[None]:
    try:
        for i, rate in rates.items():
            lab.lab.shape(i, rate)
        yield
    finally:
        for i in rates:
            lab.lab.shape(i, None)


def collective(lab, exit_code: int = 0) -> dict:
    """The JSON of `check --collective`, whose exit status gates a script: 0 when ready,
    3 when a host or link is slow."""
    done = lab.multihost("check", "--hostfile", str(lab.hostfile), "--json", "--collective",
                         "--collective-sizes", SIZES, timeout=300)
    assert done.stdout, done.stderr
    assert done.returncode == exit_code, done.stdout[-2000:]
    return json.loads(done.stdout)["collective"]


def leftovers(lab) -> dict:
    found = {}
    for i in range(1, lab.n + 1):
        out = lab.host_run(i, [sys.executable, "-c", SCAN], check=True).stdout.strip()
        if out:
            found[i] = out.splitlines()
    return found


def test_healthy_links_no_finding_and_nothing_left(lab):
    with shaped(lab, {i: RATE for i in range(1, lab.n + 1)}):
        doc = collective(lab)
    assert doc["ok"] and doc["ready"], doc
    assert doc["findings"] == []
    links = doc["links"]
    n = lab.n
    assert all(links["bits_per_s"][i][j] for i in range(n) for j in range(n) if i != j)
    assert all(links["ifaces"][i][j] == "eth0" for i in range(n) for j in range(n) if i != j)
    run = doc["collective"]
    assert run["backend"] == "gloo" and run["ranks"] == n and run["error"] is None
    assert {r["op"] for r in run["rows"]} == {"all_reduce", "all_gather"}
    assert leftovers(lab) == {}


def test_one_slow_host_is_named(lab):
    rates = {i: RATE for i in range(1, lab.n + 1)}
    rates[3] = SLOW_RATE
    with shaped(lab, rates):
        doc = collective(lab, exit_code=3)
    assert [f["host"] for f in doc["findings"]] == [lab.address(3)], doc["findings"]
    assert doc["measured_twice"] and doc["ready"] is False  # slow both times
    finding = doc["findings"][0]
    assert finding["bits_per_s"] < 0.7 * finding["median_bits_per_s"]
    assert "tc qdisc show dev eth0" in finding["fix"]
    assert leftovers(lab) == {}
