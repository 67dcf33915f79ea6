"""How a progress bar being redrawn (LogProgress) reaches --json and the plain view."""
import io
import json

from multihost.events import LogBlock, LogProgress
from multihost.views.jsonl import JsonView
from multihost.views.plain import PROGRESS_EVERY, PlainView


def test_a_bars_state_and_a_trainers_dict_line_give_metrics_records_of_their_rank():
    out = io.StringIO()
    view = JsonView(out)
    view(LogProgress(1, "h2", 0, 2, "Epoch 0:  45%| | 9/20 [00:01<00:01,  7.12it/s, train_loss=0.693]", 5.0))
    view(LogBlock(0, "h1", 0, 0, "plain words\n{'loss': 0.52, 'learning_rate': 5e-05, 'epoch': 0.3}", 6.0))
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["event"] for r in records] == ["progress", "metrics", "line", "line", "metrics"]
    assert {k: records[1][k] for k in ("rank", "host", "step", "loss", "speed")} == \
        {"rank": 2, "host": "h2", "step": 9, "loss": 0.693, "speed": 7.12}
    assert (records[4]["rank"], records[4]["loss"], records[4]["epoch"]) == (0, 0.52, 0.3)


def test_a_pipe_gets_a_ranks_bar_every_half_minute_not_at_every_redraw():
    out, err = io.StringIO(), io.StringIO()
    view = PlainView(out, err)
    for tenth in range(0, 700):   # 70 s of a bar redrawn 10 times a second
        view(LogProgress(0, "h1", 1, 1, f" {tenth}/700 [00:01<00:02, 9.0it/s]", 100.0 + tenth / 10))
    printed = out.getvalue().splitlines()
    assert printed == [f"h1 [1]:  {t}/700 [00:01<00:02, 9.0it/s]"
                       for t in range(0, 700, int(PROGRESS_EVERY * 10))]
