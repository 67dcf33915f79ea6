"""Progress numbers read from the log lines of the trainers users run."""
import pytest

from multihost.logs.metrics import Metrics, parse_metrics

CASES = [
    ("epoch: 0, step:200, train_loss: 0.424425, total time cost = 0.000947, speed: 1055.967774",
     Metrics(0, 200, 0.424425, 1055.967774)),
    ("[2026/01/01 10:00:00] ppocr INFO: epoch: [1/500], global_step: 10, lr: 0.001000, "
     "loss: 1.234500, avg_reader_cost: 0.1 s, ips: 80.5 samples/s, eta: 0:10:00",
     Metrics(1, 10, 1.2345, 80.5)),
    ("[01/01 10:00:00] ppdet.engine INFO: Epoch: [0] [  20/1000] learning_rate: 0.000100 "
     "loss: 2.100000 eta: 1:00:00 batch_cost: 0.5 ips: 12.3 images/s",
     Metrics(0, 20, 2.1, 12.3)),
    ("{'loss': 0.52, 'learning_rate': 5e-05, 'epoch': 0.3}", Metrics(0.3, None, 0.52, None)),
    ("Training:  24%|██▍       | 120/500 [00:10<00:30, 11.90it/s]", Metrics(None, 120, None, 11.9)),
    ("epoch 2 step 30 loss 0.0123 speed 456.7 samples/s", Metrics(2, 30, 0.0123, 456.7)),
    # Lightning 2.6's TQDMProgressBar and RichProgressBar (metrics on the bar's line)
    ("Epoch 0:  45%|████▌     | 9/20 [00:01<00:01,  7.12it/s, v_num=0, train_loss=0.693]",
     Metrics(0, 9, 0.693, 7.12)),
    ("Epoch 1/2  ━━━━━━━━╸ 12/20 0:00:01 • 0:00:02 18.95it/s v_num: 5.000 train_loss: 1.221",
     Metrics(1, 12, 1.221, 18.95)),
    ("Epoch 3:  10%|█   | 2/20 [00:05<00:45,  2.50s/it, v_num=1, train_loss_step=0.5]",
     Metrics(3, 2, 0.5, 0.4)),
    # transformers 5: the Trainer's log dict, numbers as strings, and its tqdm bar
    ("{'loss': '0.6931', 'grad_norm': '1.204', 'learning_rate': '5e-05', 'epoch': '0.5'}",
     Metrics(0.5, None, 0.6931, None)),
    (" 25%|██▌       | 5/20 [00:01<00:03,  4.50it/s]", Metrics(None, 5, None, 4.5)),
]


@pytest.mark.parametrize("line, expected", CASES)
def test_known_trainer_lines(line, expected):
    assert parse_metrics(line) == expected


@pytest.mark.parametrize("line", ["val_loss=0.31, v_num=3", "Sanity Checking: 0it [00:00, ?it/s]",
                                  "", "Connecting to 10.0.0.1:6170", "NCCL INFO Bootstrap : Using eth0",
                                  "Downloading 100 files", "x" * 5000])
def test_lines_without_progress_give_nothing(line):
    assert not parse_metrics(line)


def test_merging_keeps_the_latest_known_value():
    merged = Metrics(1, 10, 0.5, 100.0).merged(Metrics(None, 11, 0.4, None))
    assert merged == Metrics(1, 11, 0.4, 100.0)
