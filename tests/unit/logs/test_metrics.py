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
    ("Training:  24%|██▍       | 120/500 [00:10<00:30, 11.90it/s]", Metrics(None, None, None, 11.9)),
    ("epoch 2 step 30 loss 0.0123 speed 456.7 samples/s", Metrics(2, 30, 0.0123, 456.7)),
]


@pytest.mark.parametrize("line, expected", CASES)
def test_known_trainer_lines(line, expected):
    assert parse_metrics(line) == expected


@pytest.mark.parametrize("line", ["", "Connecting to 10.0.0.1:6170", "NCCL INFO Bootstrap : Using eth0",
                                  "Downloading 100 files", "x" * 5000])
def test_lines_without_progress_give_nothing(line):
    assert not parse_metrics(line)


def test_merging_keeps_the_latest_known_value():
    merged = Metrics(1, 10, 0.5, 100.0).merged(Metrics(None, 11, 0.4, None))
    assert merged == Metrics(1, 11, 0.4, 100.0)
