"""What a user reads: the table (rich and plain), the folded rows, the findings with their
fixes, the ping matrix, and the JSON document."""
import dataclasses
import io
import json

from rich.console import Console

from multihost.check.report import CheckReport
from multihost.errors import ConnectError
from multihost.views.check_view import fold_rows, render_json, render_plain, render_rich
from test_check_samples import ADDRESSES, lab_probes, report_of, with_facts


def plain(report: CheckReport, **kw) -> str:
    out = io.StringIO()
    render_plain(report, out, **kw)
    return out.getvalue()


def rich(report: CheckReport, width: int) -> str:
    console = Console(width=width, color_system=None, force_terminal=True, record=True)
    render_rich(report, console)
    return console.export_text()


def cut_third_host() -> CheckReport:
    probes = lab_probes()
    error = ConnectError("no answer from 198.18.0.13:22 within 2s", host="198.18.0.13",
                         kind=ConnectError.TIMEOUT, fix="check that the host is up and that no "
                                                        "firewall drops port 22; ping it")
    probes[2] = dataclasses.replace(probes[2], ssh_error=error, facts=None, rendezvous=None,
                                    reach={"rtt": None, "method": "icmp", "tcp": {"error": "timeout"}})
    for i in (0, 1, 3):
        rtt = dict(probes[i].facts["ping"]["rtt"], **{ADDRESSES[2]: None})
        probes[i] = with_facts(probes[i], ping={"rtt": rtt, "method": "icmp"})
    return report_of(probes)


def test_identical_hosts_share_a_row_and_the_first_host_keeps_its_own():
    rows = fold_rows(report_of(lab_probes()))
    assert [[h.host.rank for h in hosts] for hosts, _ in rows] == [[0], [1, 2, 3]]
    text = plain(report_of(lab_probes()))
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["RANK", "HOST", "REACH", "SSH"]
    assert lines[2].startswith("1-3") and "198.18.0.[12-14]" in lines[2]
    assert text.rstrip().splitlines()[-1].startswith("ready: 4 hosts, start port 17000")


def test_failures_are_listed_once_with_their_hosts_and_fix():
    text = plain(cut_third_host())
    assert "FAIL 198.18.0.13: ssh: no answer from 198.18.0.13:22 within 2s" in text
    assert "fix: check that the host is up" in text
    # The same finding on three hosts is one line naming all three.
    assert text.count("ping: no echo from 198.18.0.13") == 1
    assert "FAIL 198.18.0.[11-12,14]: ping: no echo from 198.18.0.13" in text
    assert "NOT ready:" in text.splitlines()[-1]


def test_the_ping_matrix_appears_only_when_a_pair_is_silent():
    assert "ping matrix" not in plain(report_of(lab_probes()))
    text = plain(cut_third_host())
    matrix = text[text.index("ping matrix"):].splitlines()
    assert matrix[1].split() == ["0", "1", "2", "3"]
    assert matrix[2].split() == ["198.18.0.11", "0", ".", "ok", "X", "ok"]
    assert matrix[4].split() == ["198.18.0.13", "2", "?", "?", ".", "?"]  # never asked


def test_rich_table_on_a_wide_terminal_shows_details():
    text = rich(report_of(lab_probes()), 200)
    assert "rendezvous" in text and "✓ torch 2.13.0+cpu" in text and "✓ :17000 3/3" in text
    assert "ready: 4 hosts" in text


def test_rich_table_on_a_narrow_terminal_stays_readable():
    text = rich(cut_third_host(), 80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "rdzv=rendezvous" in text  # the compact table explains its short headers
    assert "198.18.0.[12-14]" not in text  # the cut host breaks the fold
    assert "no answer from 198.18.0.13:22 within 2s" in text


def test_verbose_lists_every_check_of_every_host():
    text = plain(report_of(lab_probes(2)), verbose=True)
    assert "198.18.0.12 [1] clock: pass: +0.01 s against the controller (±0.02 s)" in text


def test_json_is_one_document():
    out = io.StringIO()
    render_json(cut_third_host(), out)
    doc = json.loads(out.getvalue())
    assert doc["ok"] is False
    third = doc["hosts"][2]
    assert third["rank"] == 2 and third["address"] == "198.18.0.13"
    assert {c["name"]: c["status"] for c in third["checks"]}["ssh"] == "fail"


def test_the_same_failure_on_several_hosts_is_one_line():
    probes = lab_probes()
    for i in (2, 3):
        error = ConnectError(f"no answer from {ADDRESSES[i]}:22 within 2s", host=ADDRESSES[i],
                             kind=ConnectError.TIMEOUT, fix="check that the host is up")
        probes[i] = dataclasses.replace(probes[i], ssh_error=error, facts=None, rendezvous=None)
    text = plain(report_of(probes))
    assert "FAIL 198.18.0.[13-14]: ssh: no answer from <host>:22 within 2s" in text
    assert text.count("ssh: no answer") == 1


def test_the_progress_line_names_the_hosts_still_pending_from_the_checks_events():
    from multihost.events import CheckStage
    from multihost.hosts import Host
    from multihost.views.check_view import Progress

    hosts = [Host(a, rank=i) for i, a in enumerate(ADDRESSES)]
    console = Console(width=100, color_system=None, force_terminal=True, record=True)
    progress = Progress(console, hosts)
    for i, host in enumerate(hosts[:-1]):
        progress(CheckStage(host.label, i, "checking"))
        progress(CheckStage(host.label, i, "done"))
    progress(object())                      # not a check's event: ignored
    assert progress._text() == f"checking {len(hosts)} hosts: waiting for {hosts[-1].label}"
    progress(CheckStage(hosts[-1].label, len(hosts) - 1, "done"))
    assert progress._text() == "checking: done"


def test_in_a_pipe_the_command_shows_the_table_then_the_spares_verdict():
    from multihost.views.check_view import CheckView

    out, err = io.StringIO(), io.StringIO()
    view = CheckView(out, err)
    with view.checking([]) as progress:
        assert progress is None                  # nothing drawn in a pipe
    view.report(report_of(lab_probes()))
    view.finish(report_of(lab_probes()), spares={
        "ready": ["10.0.0.6"], "unusable": ["10.0.0.5"], "total": 2,
        "warnings": ["warning: spare 10.0.0.5 is not usable: ssh: refused"]})
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:2] == ["RANK", "HOST"] and lines[-2].startswith("ready: 4 hosts")
    assert lines[-1] == "spares: 1 of 2 ready (10.0.0.6)"
    assert err.getvalue() == "multihost: warning: spare 10.0.0.5 is not usable: ssh: refused\n"


def test_with_json_the_command_prints_one_document_at_the_end():
    from multihost.views.check_view import CheckView

    out, err = io.StringIO(), io.StringIO()
    view = CheckView(out, err, json=True)
    view.report(report_of(lab_probes()))
    assert out.getvalue() == ""
    view.finish(report_of(lab_probes()), spares={"ready": [], "unusable": ["10.0.0.5"],
                                                 "total": 1, "warnings": ["w"]})
    doc = json.loads(out.getvalue())
    assert doc["ok"] is True and doc["spares"] == {"ready": [], "unusable": ["10.0.0.5"],
                                                   "warnings": ["w"]}
    assert err.getvalue() == ""


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_command_shows_the_rich_table(monkeypatch):
    from multihost.views.check_view import CheckView

    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = Terminal()
    view = CheckView(out, io.StringIO())
    with view.checking([]) as progress:
        assert progress is not None
    view.report(report_of(lab_probes()))
    assert "✓ ready: 4 hosts" in out.getvalue()
    plain_view = CheckView(out, io.StringIO(), plain=True)
    with plain_view.checking([]) as progress:
        assert progress is None
