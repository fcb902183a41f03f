"""What changes with the step: the learning rate (a factor of each optimizer group's peak) and, under
optim.optimizer=muon, Muon's momentum and weight decay.

    point = schedule.at(step, cfg.schedule)      # .lr_factor, .muon_momentum, .weight_decay_factor
    strategy.set_schedule(point)

The learning rate warms up linearly over schedule.warmup_steps, then decays to schedule.min_lr_ratio
of its peak at max_steps: along a cosine (schedule.decay=cosine), or held until the last
warmdown_ratio of the steps and then linearly (warmdown, nanochat's). Muon's momentum rises from
0.85 to 0.97 over its first 400 steps (a young momentum buffer is noise) and falls to 0.90 during
the warmdown; its weight decay follows a half cosine from its peak to 0 at max_steps.

schedule.min_lr_ratio=1 is a run without decay, one that may go on by raising max_steps and resuming:
then nothing depends on max_steps (no warmdown, Muon's weight decay held at its peak), so the longer
run's steps equal those of a run given the larger max_steps from the start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..settings.config import ScheduleConfig

MOMENTUM_START, MOMENTUM_PEAK, MOMENTUM_END = 0.85, 0.97, 0.90
MOMENTUM_WARMUP_STEPS = 400


@dataclass(frozen=True)
class Point:
    lr_factor: float
    muon_momentum: float
    weight_decay_factor: float


def decays(s: ScheduleConfig) -> bool:
    return s.min_lr_ratio < 1.0


def warmdown_steps(s: ScheduleConfig) -> int:
    return round(s.warmdown_ratio * s.max_steps) if s.decay == "warmdown" and decays(s) else 0


def weight_decay_factor(step: int, s: ScheduleConfig) -> float:
    return 0.5 * (1 + math.cos(math.pi * step / s.max_steps)) if decays(s) else 1.0


def lr_factor(step: int, s: ScheduleConfig) -> float:
    if step < s.warmup_steps:
        return (step + 1) / s.warmup_steps
    if s.decay == "cosine":
        progress = min(1.0, (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps))
        return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    warmdown = warmdown_steps(s)
    if step <= s.max_steps - warmdown:
        return 1.0
    left = (s.max_steps - step) / warmdown
    return left + (1 - left) * s.min_lr_ratio


def muon_momentum(step: int, s: ScheduleConfig) -> float:
    warmdown = warmdown_steps(s)
    if step < MOMENTUM_WARMUP_STEPS:
        share = step / MOMENTUM_WARMUP_STEPS
        return (1 - share) * MOMENTUM_START + share * MOMENTUM_PEAK
    if warmdown and step >= s.max_steps - warmdown:
        share = (step - (s.max_steps - warmdown)) / warmdown
        return (1 - share) * MOMENTUM_PEAK + share * MOMENTUM_END
    return MOMENTUM_PEAK


def at(step: int, s: ScheduleConfig) -> Point:
    return Point(
        lr_factor=lr_factor(step, s),
        muon_momentum=muon_momentum(step, s),
        weight_decay_factor=weight_decay_factor(step, s),
    )
