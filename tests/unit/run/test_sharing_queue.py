"""The line a queued run waits in, as every controller sees it: first asked, first
served; only what overlaps counts; `status --all` shows each run once, queued ones with
their place."""
from multihost.hosts import Host
from multihost.registry.holders import merge
from multihost.views.status_all_view import rows
from multihost.registry.queue import Ticket


class Hosts:
    hosts = (Host("198.18.0.11", rank=0), Host("198.18.0.12", rank=1))


def ticket(gpus=None):
    t = Ticket(Hosts(), "mine", {h.label: gpus for h in Hosts.hosts}, {})
    t.asked, t.run_id = 100.0, "20261127-110000-0000"
    return t


def queue(run_id, asked, gpus=None, user="alice", name=""):
    return {"kind": "queue", "run_id": run_id, "time": asked, "gpus": gpus, "live": True,
            "user": user, "name": name, "ports": [], "seen": asked}


def run(run_id, gpus=None, user="alice", name="bert-large", live=True, state="running", **more):
    return dict({"kind": "run", "run_id": run_id, "gpus": gpus, "live": live, "user": user,
                 "name": name, "ports": [], "state": state, "time": 50.0, "pid": 7}, **more)


def test_only_earlier_asks_and_live_holders_that_overlap_stand_before_a_run():
    t = ticket()
    earlier = queue("20261127-100000-aaaa", 90.0)
    later = queue("20261127-120000-bbbb", 110.0)
    assert t.blockers({"198.18.0.11": [later]}) == []
    assert t.blockers({"198.18.0.12": [earlier, later]}) == [("198.18.0.12", earlier)]
    ended = run("20261127-090000-cccc", live=False, state="succeeded")
    assert t.blockers({"198.18.0.11": [ended]}) == []
    on_other_gpus = ticket(gpus=[4, 5])
    assert on_other_gpus.blockers({"198.18.0.11": [run("20261127-090000-cccc", gpus=[0, 1])]}) == []


def test_the_place_line_names_who_is_ahead_and_where():
    t = ticket()
    holder = run("20261127-090000-cccc")
    line = t.place_line([("198.18.0.11", holder), ("198.18.0.12", holder),
                         ("198.18.0.12", queue("20261127-100000-aaaa", 90.0, user="bob"))])
    assert line.startswith('queued: 2nd, behind alice\'s run "bert-large" (run 20261127-090000-cccc')
    assert line.endswith("on 198.18.0.[11-12]")


def test_status_all_shows_each_run_once_with_the_worst_news_and_queue_places():
    runs = merge({
        "h1": [run("20261127-090000-cccc", started=60.0), queue("20261127-100000-aaaa", 90.0),
               queue("20261127-095000-dddd", 80.0, user="bob")],
        "h2": [run("20261127-090000-cccc", state="failed", live=False, exit_code=3,
                   ended=70.0, started=60.0)]})
    by_id = {r.run_id: r for r in runs}
    assert by_id["20261127-090000-cccc"].state == "failed"
    assert by_id["20261127-090000-cccc"].hosts == ("h1", "h2")
    assert (by_id["20261127-095000-dddd"].place, by_id["20261127-100000-aaaa"].place) == (1, 2)
    table = rows(runs, now=100.0)
    assert ("queued (1st)", "bob") == (table[0][3], table[0][2])
    failed = [r for r in table if r[0] == "20261127-090000-cccc"][0]
    assert failed[7:] == ("3", "10s")


def test_a_hosts_registry_reply_is_cleaned_and_only_well_formed_entries_are_kept():
    from multihost.registry.holders import registry_entries

    reply = {"entries": [{"kind": "run", "run_id": "20261127-1102-ab12",
                          "user": "mallory\x1b]0;owned\x07", "name": "x\x1b[2J"},
                         "not an entry", {"kind": "run"}, {"kind": "?", "run_id": "r"}]}
    kept = registry_entries(reply)
    assert len(kept) == 1 and "\x1b" not in kept[0]["user"] + kept[0]["name"]
    assert registry_entries({"entries": "nope"}) == [] and registry_entries(None) == []


def test_a_run_failed_on_one_host_and_stopped_on_the_others_is_failed_and_listed_first():
    from multihost.registry.holders import chosen

    ended = dict(live=False, started=60.0)
    runs = merge({
        "h1": [run("20261127-080000-0001", state="stopped", exit_code=143, ended=70.0, **ended),
               run("20261127-070000-0002", state="succeeded", exit_code=0, ended=65.0, **ended),
               run("20261127-060000-0003", state="stopped", exit_code=143, ended=64.0,
                   controller="bob@laptop", **ended),
               run("20261127-090000-0004", controller="bob@laptop")],
        "h2": [run("20261127-080000-0001", state="failed", exit_code=3, ended=69.0, **ended)]})
    assert [(r.run_id[-4:], r.state) for r in runs] == [
        ("0004", "running"), ("0001", "failed"), ("0003", "stopped"), ("0002", "succeeded")]
    assert [r.run_id[-4:] for r in chosen(runs)] == ["0004"]            # ended: with --ended
    assert [r.run_id[-4:] for r in chosen(runs, ended=True, mine="bob")] == ["0004", "0003"]
    assert [r.run_id[-4:] for r in chosen(runs, state="failed")] == ["0001"]


def test_a_queued_run_says_its_place_again_only_when_it_changes(monkeypatch):
    import multihost.registry.queue as queue_module

    t = ticket()
    holder = run("20261127-090000-cccc", started=50.0)
    other = queue("20261127-095000-dddd", 90.0, user="bob")
    turns = iter([[holder, other]] * 3 + [[holder]] * 2 + [[]])   # 2nd, then 1st, then go
    clock = iter(range(1000, 2000, 2))       # the holder's age grows at every look
    monkeypatch.setattr(t, "refresh", lambda: {"198.18.0.11": next(turns)})
    monkeypatch.setattr(queue_module.time, "sleep", lambda s: None)
    monkeypatch.setattr(queue_module.time, "time", lambda: float(next(clock)))
    monkeypatch.setattr(t, "_save", lambda: None)
    monkeypatch.setattr(t, "_keep", lambda: None)
    said = []
    t.wait_turn(said.append)
    assert [line.split(",")[0] for line in said] == ["queued: 2nd", "queued: 1st",
                                                     "queued run mine: its turn"]
