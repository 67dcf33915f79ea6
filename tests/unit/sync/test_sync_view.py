"""What the user reads after a sync or a data check, and the plain progress lines."""
import io

from multihost.data.verify import DataReport, HostData, PathDiff, PathState
from multihost.events import SyncPlanned, SyncProgress, SyncScanned, SyncWaiting
from multihost.sync.model import HostNeeds, HostSync, SyncReport
from multihost.views.sync_view import SyncView, data_lines, sync_lines


def report(*hosts, **kw):
    return SyncReport("/home/me/proj", 2001, 220_000_000, tuple(hosts), commit="3f2a1c9d0e1f2a3b",
                      dirty=True, seconds=3.2, **kw)


def test_summary_names_each_host_and_what_came_host_to_host():
    lines = sync_lines(report(
        HostSync("10.0.0.1", 0, files=2001, bytes=220_000_000, counts=(2001, 0, 0)),
        HostSync("10.0.0.2", 1, files=2001, bytes=220_000_000, relayed_bytes=200_000_000,
                 deleted=2, counts=(2001, 0, 2)),
        HostSync("10.0.0.3", 2)))
    assert lines[0] == ("code /home/me/proj: 2,001 files, 220.0 MB at git 3f2a1c9d0e1f "
                        "(dirty: uncommitted changes travel too)")
    assert lines[1] == "10.0.0.1: 2,001 files (220.0 MB) written"
    assert lines[2] == "10.0.0.2: 2,001 files (220.0 MB) written, 2 deleted; 200.0 MB came host to host"
    assert lines[3] == "10.0.0.3: up to date"
    assert lines[-1] == "3 of 3 hosts identical to /home/me/proj (440.0 MB written in 3.2s)"


def test_a_failed_host_shows_cause_and_fix():
    lines = sync_lines(report(HostSync("10.0.0.1", 0), HostSync("10.0.0.2", 1, error="disk full",
                                                               fix="free space")))
    assert "10.0.0.2: FAILED: disk full (fix: free space)" in lines
    assert lines[-1].startswith("1 of 2 hosts identical") and lines[-1].endswith("FAILED: 10.0.0.2")


def test_dry_run_lists_the_first_paths_per_host_then_counts():
    host = HostSync("h1", 0, bytes=30, counts=(7, 1, 1), added=("a", "b", "c", "d", "e"),
                    changed=("x.py",), removed=("old.py",))
    lines = sync_lines(report(host, dry_run=True))
    assert lines[1] == "h1: would add 7, change 1, delete 1 (30 B to send)"
    assert lines[2:10] == ["    + a", "    + b", "    + c", "    + d", "    + e",
                           "    + ... and 2 more", "    ~ x.py", "    - old.py"]
    assert lines[-1].startswith("dry run: nothing was changed")


def test_data_lines_show_names_under_the_host():
    diff = PathDiff("/data/coco", "h1", missing=("train/9.jpg",), extra=("x",),
                    differing=("train/7.jpg",), counts=(1, 1, 12))
    state = PathState("/data/coco", "/data/coco", True, 31, 1000)
    good = HostData("h1", 0, (state,), (PathDiff("/data/coco", "h1"),))
    bad = HostData("h2", 1, (state,), (diff,))
    lines = data_lines(DataReport(("/data/coco",), (good, bad)))
    assert lines[0] == "data /data/coco: differs on 1 of 2 hosts (compared with h1)"
    assert lines[1].startswith("  h2: /data/coco: 1 missing (train/9.jpg), 1 extra (x), 12 differing")
    assert "      differing train/7.jpg" in lines and "      differing ... and 11 more" in lines
    ok = data_lines(DataReport(("/data/coco",), (good,)))
    assert ok == ["data /data/coco: identical on 1 host (31 files, 1.0 KB)"]


def test_plain_progress_is_quiet_for_quick_syncs_and_periodic_for_long_ones(monkeypatch):
    import multihost.views.sync_view as view_module

    out = io.StringIO()
    view = SyncView(out, plain=True)
    view(SyncScanned(10, 5000, 10, 5000, 0.1))
    view(SyncPlanned("h1", HostNeeds(0, "/w", (), (), (), (), ("gone.py",), (), (), ())))
    view(SyncProgress("h1", 0, 1, 10, 500, 5000))
    assert out.getvalue().splitlines() == ["code: 10 files, 5.0 KB (hashed 5.0 KB)",
                                           "h1: sending 0 files (0 B), deleting 1"]
    monkeypatch.setattr(view_module, "PLAIN_EVERY", 0.0)
    view(SyncProgress("h1", 0, 5, 10, 2500, 5000))
    assert out.getvalue().splitlines()[-1] == "h1: 5/10 files, 2.5 KB/5.0 KB"


def test_terminal_progress_renders_without_error():
    out = io.StringIO()
    view = SyncView(out, plain=False)
    from multihost.sync.manifest import Entry

    entry = Entry("w.bin", "f", 5000, 0o644, 1, "h")
    view(SyncPlanned("h1", HostNeeds(0, "/w", (entry,), (entry,), (), (), (), ("w.bin",), (), ())))
    view(SyncProgress("h1", 0, 1, 1, 5000, 5000))
    view.show_sync(report(HostSync("h1", 0, files=1, bytes=5000, counts=(1, 0, 0))))
    assert "h1: 1 file (5.0 KB) written" in out.getvalue()


def test_a_host_waiting_for_another_sync_says_so_in_plain_lines():
    out = io.StringIO()
    view = SyncView(out, plain=True)
    view(SyncWaiting("10.0.0.2", "waiting for bob's multihost sync from ctl (pid 7) since "
                                 "16:02:11 to finish with /root/proj"))
    assert out.getvalue() == ("10.0.0.2: waiting for bob's multihost sync from ctl (pid 7) "
                              "since 16:02:11 to finish with /root/proj\n")


def test_a_host_that_waited_says_for_whom_under_its_line():
    host = HostSync("10.0.0.2", 1, files=3, bytes=30, counts=(3, 0, 0),
                    notes=("waited 12 s for bob's multihost sync from ctl (pid 7) since 16:02:11",))
    lines = sync_lines(report(host))
    assert lines[1:3] == ["10.0.0.2: 3 files (30 B) written",
                          "    note: waited 12 s for bob's multihost sync from ctl (pid 7) "
                          "since 16:02:11"]


def test_the_code_is_said_once_when_the_sync_goes_in_parts():
    out = io.StringIO()
    view = SyncView(out, plain=True)
    view(SyncScanned(10, 5000, 0, 0, 0.1))     # the first host's part, beside the probe
    view(SyncScanned(10, 5000, 0, 0, 0.2))     # the other hosts' part
    assert out.getvalue().splitlines() == ["code: 10 files, 5.0 KB"]
