"""Read training progress out of log lines: epoch, step, loss and speed.

Patterns of the reference docs' trainers and the common ones:
  fleet examples     ``epoch: 0, step:200, train_loss: 0.42, ..., speed: 1055.9``
  PaddleOCR          ``epoch: [1/500], global_step: 10, lr: 0.001, loss: 1.23, ips: 80.5 samples/s``
  PaddleDetection    ``Epoch: [0] [  20/1000] learning_rate: 0.0001 loss: 2.1 ... ips: 12.3 images/s``
  HF Trainer         ``{'loss': 0.52, 'learning_rate': 5e-05, 'epoch': 0.3}``
  tqdm               ``... 120/500 [00:10<00:30, 11.9it/s]``
A pure function of one line, so it is tested with recorded lines and costs microseconds.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

_NUM = r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
_SEP = r"['\"]?\s*[:=]?\s*"

_EPOCH = re.compile(r"\bepoch" + _SEP + r"\[?\s*" + _NUM, re.I)
_EPOCH_STEP = re.compile(r"\bepoch\s*:?\s*\[\s*\d+\s*\]\s*\[\s*(\d+)\s*/\s*\d+\s*\]", re.I)
_STEP = re.compile(r"\b(?:global_step|step|iter(?:ation)?|batch)" + _SEP + r"\[?\s*(\d+)", re.I)
_LOSS = re.compile(r"\b(?:train_loss|total_loss|loss)" + _SEP + _NUM, re.I)
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


def parse_metrics(line: str) -> Metrics:
    """The numbers a line carries; an empty Metrics when it carries none."""
    if len(line) > 2000 or not any(ch.isdigit() for ch in line):
        return Metrics()
    lowered = line.lower()
    if not any(word in lowered for word in ("epoch", "step", "iter", "loss", "speed", "ips",
                                            "/s", "throughput", "batch")):
        return Metrics()
    epoch = _float(_EPOCH.search(line))
    step_match = _EPOCH_STEP.search(line) or _STEP.search(line)
    step = int(step_match.group(1)) if step_match else None
    loss = _float(_LOSS.search(line))
    speed = _float(_SPEED.search(line)) or _float(_RATE.search(line))
    return Metrics(epoch=epoch, step=step, loss=loss, speed=speed)
