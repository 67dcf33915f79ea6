"""Read training progress out of log lines: epoch, step, loss and speed.

Patterns of the reference docs' trainers and the common ones:
  fleet examples     ``epoch: 0, step:200, train_loss: 0.42, ..., speed: 1055.9``
  PaddleOCR          ``epoch: [1/500], global_step: 10, lr: 0.001, loss: 1.23, ips: 80.5 samples/s``
  PaddleDetection    ``Epoch: [0] [  20/1000] learning_rate: 0.0001 loss: 2.1 ... ips: 12.3 images/s``
  HF Trainer         ``{'loss': 0.52, 'learning_rate': 5e-05, 'epoch': 0.3}`` (or '0.52')
  tqdm               ``... 120/500 [00:10<00:30, 11.9it/s]`` (``2.50s/it`` when slow)
  Lightning (tqdm)   ``Epoch 0:  45%|####5  | 9/20 [00:01<00:01, 7.12it/s, v_num=0, train_loss=0.693]``
  Lightning (rich)   ``Epoch 0/1  ━━━╸ 9/20 0:00:01 • 0:00:02 7.12it/s v_num: 0.000 train_loss: 0.693``
The step of a bar is its count (``9/20``): Lightning's counts batches of the epoch.
A pure function of one line, so it is tested with recorded lines and costs microseconds.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

_NUM = r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
_SEP = r"['\"]?\s*[:=]?\s*['\"]?"     # a quoted number too: {'loss': '0.69'}

_EPOCH = re.compile(r"\bepoch" + _SEP + r"\[?\s*" + _NUM, re.I)
_EPOCH_STEP = re.compile(r"\bepoch\s*:?\s*\[\s*\d+\s*\]\s*\[\s*(\d+)\s*/\s*\d+\s*\]", re.I)
_STEP = re.compile(r"\b(?:global_step|step|iter(?:ation)?|batch)" + _SEP + r"\[?\s*(\d+)", re.I)
_LOSS = re.compile(r"\b(?:train_loss|total_loss|loss)(?:_step)?" + _SEP + _NUM, re.I)
# A bar's count: "9/20" before tqdm's "[00:01<..." or rich's "0:00:01" (not "Epoch 0/1").
_BAR_COUNT = re.compile(r"(?<![\w./])(\d+)\s*/\s*\d+\s*(?:\[\d|\d+:\d\d)")
_SLOW_RATE = re.compile(_NUM + r"\s*s\s*/\s*it\b", re.I)
_SPEED = re.compile(r"\b(?:speed|ips|throughput)" + _SEP + _NUM, re.I)
_RATE = re.compile(_NUM + r"\s*(?:samples|images|imgs|img|tokens|sequences|it)\s*/\s*s(?:ec)?\b", re.I)


@dataclass(frozen=True)
class Metrics:
    epoch: Optional[float] = None
    step: Optional[int] = None
    loss: Optional[float] = None
    speed: Optional[float] = None   # samples (or items) per second, as the trainer says

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.epoch, self.step, self.loss, self.speed))

    def merged(self, newer: "Metrics") -> "Metrics":
        """The latest known value of each field."""
        return Metrics(*(n if n is not None else o for o, n in
                         zip((self.epoch, self.step, self.loss, self.speed),
                             (newer.epoch, newer.step, newer.loss, newer.speed))))


def _float(match: Optional["re.Match[str]"]) -> Optional[float]:
    return float(match.group(1)) if match else None


def _per_item(line: str) -> Optional[float]:
    """tqdm's ``2.50s/it`` (an item slower than a second) as items per second."""
    seconds = _float(_SLOW_RATE.search(line))
    return 1.0 / seconds if seconds else None


def parse_metrics(line: str) -> Metrics:
    """The numbers a line carries; an empty Metrics when it carries none."""
    if len(line) > 2000 or not any(ch.isdigit() for ch in line):
        return Metrics()
    lowered = line.lower()
    if not any(word in lowered for word in ("epoch", "step", "iter", "loss", "speed", "ips",
                                            "/s", "/it", "throughput", "batch")):
        return Metrics()
    epoch = _float(_EPOCH.search(line))
    step_match = _EPOCH_STEP.search(line) or _STEP.search(line) or _BAR_COUNT.search(line)
    step = int(step_match.group(1)) if step_match else None
    loss = _float(_LOSS.search(line))
    speed = _float(_SPEED.search(line)) or _float(_RATE.search(line)) or _per_item(line)
    return Metrics(epoch=epoch, step=step, loss=loss, speed=speed)
