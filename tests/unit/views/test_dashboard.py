"""The dashboard rendered to a capture console, as a user would see it."""
import io

from rich.console import Console

from multihost.events import (LogLine, NodeChanged, NodeState, RootCause, RunFinished, RunStarted,
                              RunStopping)
from multihost.views.board import BoardModel
from multihost.views.dashboard import Dashboard, render

HOSTS = ("198.18.0.11", "198.18.0.12", "198.18.0.13")
T0 = 1_000_000.0


def screen(model, now=T0 + 75, width=160):
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=True)
    console.print(render(model.snapshot(), now=now))
    return console.file.getvalue()


def started(by_rank=False):
    model = BoardModel(by_rank=by_rank)
    model.apply(RunStarted("20260101-000000-abcd", HOSTS, 2, "train_ddp.py --epochs 3", T0))
    for node, host in enumerate(HOSTS):
        model.apply(NodeChanged(node, host, NodeState.RUNNING, time=T0))
    return model


def line(node, local, text, t=T0 + 1):
    return LogLine(node, HOSTS[node], local, node * 2 + local, text, t)


def test_rows_in_rank_order_with_state_uptime_and_metrics():
    model = started()
    for node in (2, 0, 1):
        model.apply(line(node, 0, f"epoch: 1, step:{100 + node}, train_loss: 0.5{node}, speed: 100.0"))
    text = screen(model)
    rows = [l for l in text.splitlines() if "198.18.0.1" in l and "running" in l]
    cells = [[c.strip() for c in r.split("│")] for r in rows]
    assert [c[2] for c in cells] == list(HOSTS)
    assert "1:15" in rows[0] and "101" in rows[1] and "0.52" in rows[2]
    # three of the six ranks print a speed: the others count at their mean, and it says so
    assert "600" in text and "the mean of the 3 ranks that print one x 6 ranks" in text


def test_a_speed_printed_on_rank_0_only_is_labelled_and_counted_for_every_rank():
    model = started()   # PaddleSeg: `[TRAIN] ... ips: 15.0 samples/sec` on rank 0, per card
    model.apply(line(0, 0, "[TRAIN] epoch: 1, iter: 20/100, loss: 2.1, ips: 15.0 samples/sec"))
    text = screen(model)
    all_row = next(l for l in text.splitlines() if "│ all" in l)
    assert "90" in all_row and "rank 0's speed x 6 ranks" in all_row


def test_a_hosts_speed_is_the_sum_of_its_ranks():
    model = started()
    for node in range(3):
        for local in range(2):  # each rank its own figure: they differ
            model.apply(line(node, local, f"epoch: 0, step:5, speed: {1500.0 + node * 2 + local}"))
    text = screen(model)
    rows = [[c.strip() for c in l.split("│")] for l in text.splitlines() if "running" in l and "│" in l]
    assert [r[8] for r in rows] == ["3,001", "3,005", "3,009"]
    assert "9,015" in text and "summed speed of 6 ranks" in text
    assert "20260101-000000-abcd" in text


def test_a_failure_turns_the_row_red_and_shows_the_root_cause():
    model = started()
    model.apply(line(1, 1, "Traceback (most recent call last):"))
    model.apply(NodeChanged(1, HOSTS[1], NodeState.FAILED, exit_code=3, time=T0 + 5))
    model.apply(NodeChanged(0, HOSTS[0], NodeState.STOPPED, time=T0 + 6))
    cause = RootCause(HOSTS[1], 1, 3, 3, "exit 3", ("ValueError: bad batch",))
    model.apply(RunFinished("20260101-000000-abcd", 3, cause, T0 + 7))
    text = screen(model)
    assert "failed (3)" in text and "stopped" in text
    assert "root cause" in text and "198.18.0.12 (node 1) rank 3: exit 3" in text
    assert "ValueError: bad batch" in text
    console = Console(file=io.StringIO(), width=160, force_terminal=True, color_system="standard")
    console.print(render(model.snapshot(), now=T0 + 75))
    assert "\x1b[31m" in console.file.getvalue() or "\x1b[1;31m" in console.file.getvalue()


def test_identical_lines_from_many_ranks_fold_with_a_count():
    model = started()
    for node in range(3):
        for local in range(2):
            model.apply(line(node, local, "NCCL INFO Bootstrap : Using eth0"))
    text = screen(model)
    recent = text[text.index("recent lines"):]
    assert recent.count("Bootstrap : Using eth0") == 1 and "6 ranks: NCCL INFO" in recent


def test_per_rank_rows():
    model = started(by_rank=True)
    for node in range(3):
        for local in range(2):
            model.apply(line(node, local, f"step {node * 2 + local}"))
    text = screen(model)
    assert all(f"rank {r}" in text for r in range(6))


def test_showing_one_hosts_full_log():
    model = started()
    for i in range(40):
        model.apply(line(0, 0, f"line {i}"))
    model.select(model.keys()[0])
    text = screen(model)
    assert "log of 198.18.0.11" in text and "line 39" in text and "line 10" in text


def test_a_host_out_of_contact_says_so_until_it_answers_again():
    model = started()
    model.apply(NodeChanged(1, HOSTS[1], NodeState.RUNNING, detail="contact lost (timeout); retrying",
                            time=T0 + 3))
    assert "[contact lost (timeout); retrying]" in screen(model)
    model.apply(NodeChanged(1, HOSTS[1], NodeState.RUNNING, detail="contact restored", time=T0 + 6))
    model.apply(line(1, 0, "back again"))
    text = screen(model)
    assert "contact lost" not in text and "back again" in text


# -- 64 hosts x 8 ranks: folded rows, a summary, any row picked ---------------------------
MANY = tuple(f"198.18.0.{10 + i}" for i in range(1, 65))


def sixty_four(by_rank=False, lost=(), failed=()):
    model = BoardModel(by_rank=by_rank)
    model.apply(RunStarted("20260101-000000-abcd", MANY, 8, "train.py", T0))
    for node, host in enumerate(MANY):
        model.apply(NodeChanged(node, host, NodeState.RUNNING, time=T0))
        for local in range(8):
            model.apply(LogLine(node, host, local, node * 8 + local, f"step:{100 + node}", T0 + 1))
    for node in lost:
        model.apply(NodeChanged(node, MANY[node], NodeState.LOST, detail="no answer for 15s",
                                time=T0 + 9))
    for node in failed:
        model.apply(NodeChanged(node, MANY[node], NodeState.FAILED, exit_code=3, time=T0 + 9))
    return model


def table_rows(text):
    return [l for l in text.splitlines() if l.count("│") >= 8]


def test_64_hosts_in_the_same_state_fold_into_one_row_with_a_summary():
    text = screen(sixty_four(lost=(8, 32, 63), failed=(20,)))
    rows = table_rows(text)
    assert len(rows) == 3, text          # running, lost, failed: not 64 rows
    running = next(r for r in rows if "running" in r)
    assert "198.18.0.[11-18,20-30,32-42,44-73]" in running and "100-162" in running and "0-7,9-19,21-31,33-62" in running
    lost = next(r for r in rows if "lost" in r)
    assert "198.18.0.[19,43,74]" in lost and "no answer for 15s" in lost
    assert "198.18.0.31" in next(r for r in rows if "failed (3)" in r)
    assert "64 hosts: 60 running, 0 finished, 1 failed, 3 lost" in text


def test_512_ranks_fold_by_rank_and_the_summary_counts_hosts():
    text = screen(sixty_four(by_rank=True, lost=(1,)))
    rows = table_rows(text)
    assert len(rows) == 2, text          # not 512 rows
    assert any("0-7,16-511" in r and "198.18.0.[11,13-74]" in r and "running" in r for r in rows)
    assert any("8-15" in r and "198.18.0.12" in r and "lost" in r for r in rows)
    assert "64 hosts: 63 running, 0 finished, 0 failed, 1 lost" in text


def test_any_host_or_rank_is_picked_beyond_the_first_nine():
    model = sixty_four(by_rank=True)
    board = Dashboard(io.StringIO())
    board.model = model
    for key in "g427\r":                 # go to rank 427
        board._key(key)
    text = screen(model)
    assert "log of rank 427" in text
    assert any(r.split("│")[2].strip() == "rank 427" for r in table_rows(text))  # unfolded
    board._key("n")
    assert model.snapshot().selected == "rank 428"
    board._key("p"), board._key("p")
    assert model.snapshot().selected == "rank 426"
    board._key("3")                      # keys 1-9 still pick the first nine at once
    assert model.snapshot().selected == "rank 2"


def test_the_jobs_speed_printed_by_every_rank_is_not_added_up():
    # The example trainer prints the job's global speed on every rank: 6 ranks saying
    # 15,000 at step 20 is a job doing 15,000, not 90,000.
    model = started()
    for node in range(3):
        for local in range(2):
            model.apply(line(node, local, "epoch: 0, step:20, train_loss: 0.5, speed: 15000.0"))
    text = screen(model)
    rows = [[c.strip() for c in l.split("│")] for l in text.splitlines() if "running" in l and "│" in l]
    assert [r[8] for r in rows] == ["15,000"] * 3
    assert "90,000" not in text and "30,000" not in text
    assert "the job's speed (every rank prints it)" in text


def test_stopping_shows_on_every_row_and_says_how_long_at_once():
    model = started()
    model.apply(RunStopping("interrupted (Ctrl-C on the controller)", 3, 10.0, True, T0 + 2))
    for node, host in enumerate(HOSTS):
        model.apply(NodeChanged(node, host, NodeState.STOPPING, time=T0 + 2))
    text = screen(model)
    assert text.count("stopping") >= 4
    assert "stopping: SIGTERM sent to 3 hosts, up to 10 s (Ctrl-C again to kill now)" in text


def test_one_hosts_log_keeps_each_lines_rank():
    model = started()
    model.apply(line(0, 0, "from the first rank"))
    model.apply(line(0, 1, "from the second rank"))
    model.select(model.keys()[0])
    text = screen(model)
    assert "[0] from the first rank" in text and "[1] from the second rank" in text


def test_at_80_columns_the_keys_that_stop_detach_and_quit_are_on_the_first_footer_line():
    text = screen(started(), width=80)
    footer = next(l for l in text.splitlines() if "[s] stop the run" in l)
    assert "[d] detach" in footer and "[q] plain lines" in footer and len(footer) <= 80


def test_a_progress_bar_moving_shows_its_step_loss_and_speed_but_adds_no_log_line():
    from multihost.events import LogProgress
    model = started()
    model.apply(line(0, 0, "a warning printed before the bar"))
    for step in (3, 9):
        model.apply(LogProgress(0, HOSTS[0], 0, 0, f"Epoch 1:  45%|####5  | {step}/20 "
                                f"[00:01<00:01,  7.12it/s, v_num=0, train_loss=0.69{step}]", T0 + 2))
    row = next(r for r in model.snapshot().rows if r.host == HOSTS[0])
    assert (row.metrics.epoch, row.metrics.step, row.metrics.loss, row.metrics.speed) == (1, 9, 0.699, 7.12)
    assert row.last_line.startswith("Epoch 1:") and row.lines == 1
