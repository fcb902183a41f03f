"""The range of every number a user gives, written once: the config's settings (BOUNDS) and the
command line's numbers (argparse types). A value outside its range is refused in one line that
names it and the fix, before any command computes with it: a count of 0 would otherwise divide by
zero in `plan` or fall back to a default in `launch`.

    bound_problems(cfg)     # [(key, message)]: rules.check_config lists them (`check`, the template's hooks)
    require_in_bounds(cfg)  # cli.py, right after loading the config: ConfigError naming every bad value
    p.add_argument("--nnodes", type=count)  # "argument --nnodes: must be a whole number of at least 1, got '0'"

Platform variables (PET_NNODES, WORLD_SIZE, SLURM_*, GPU_NUM_PER_NODE, ...) are checked where they
are read, in topology.py. No torch here.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

from .config import Config, ConfigError


@dataclass(frozen=True)
class Range:
    low: float
    high: float = math.inf
    low_open: bool = False
    """The low end itself is outside (a fraction above 0, a timeout longer than 0)."""
    high_open: bool = False

    def holds(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below  # NaN is neither

    def words(self) -> str:
        ends = [f"{'above' if self.low_open else 'at least'} {_number(self.low)}"]
        if self.high != math.inf:
            ends.append(f"{'below' if self.high_open else 'at most'} {_number(self.high)}")
        return " and ".join(ends)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


COUNT = Range(1)
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
FRACTION = Range(0, 1)
BETA = Range(0, 1, high_open=True)

BOUNDS: dict[str, Range] = {
    "cluster.nodes": COUNT,
    "cluster.gpus_per_node": COUNT,
    "cluster.max_restarts": NON_NEGATIVE,
    "cluster.stop_grace_seconds": NON_NEGATIVE,
    "model.n_kv_head": COUNT,
    "model.sequence_len": COUNT,
    "model.softcap": NON_NEGATIVE,
    "model.dropout": BETA,
    "model.attention_dropout": BETA,
    "data.vocab_size": COUNT,
    "data.tokenizer_train_chars": COUNT,
    "data.val_fraction": Range(0, 1, low_open=True, high_open=True),
    "data.shard_tokens": COUNT,
    "optim.lr": NON_NEGATIVE,
    "optim.weight_decay": NON_NEGATIVE,
    "optim.beta1": BETA,
    "optim.beta2": BETA,
    "optim.eps": NON_NEGATIVE,
    "optim.grad_clip": NON_NEGATIVE,
    "schedule.max_steps": COUNT,
    "schedule.epochs": POSITIVE,
    "schedule.warmup_steps": NON_NEGATIVE,
    "schedule.min_lr_ratio": FRACTION,
    "batch.global_batch_size": COUNT,
    "batch.micro_batch_size": COUNT,
    "batch.grad_accum_steps": COUNT,
    "checkpoint.every_steps": NON_NEGATIVE,
    "checkpoint.keep_last": COUNT,
    "logging.every_steps": COUNT,
    "logging.eval_every_steps": NON_NEGATIVE,
    "logging.eval_batches": COUNT,
    "eval.tasks_every_steps": NON_NEGATIVE,
    "eval.tasks_max_per_task": COUNT,
    # numpy seeds each rank with seed + rank, and numpy takes at most 2**32 - 1
    "run.seed": Range(0, 2**31 - 1),
    "run.collective_timeout_minutes": POSITIVE,
    "run.debug_timeout_minutes": POSITIVE,
    "parallel.tensor": COUNT,
    "parallel.pipeline": COUNT,
}


def bound_problems(cfg: Config) -> list[tuple[str, str]]:
    """(key, one-line message) for every setting outside its range; null (an optional setting's
    'derive it') is always in range."""
    defaults = Config()
    found = []
    for key, allowed in BOUNDS.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value is None or (allowed.holds(value) and math.isfinite(value)):
            continue
        default = getattr(getattr(defaults, section), name)
        example = f"{key}={_number(default)}" if default is not None and allowed.holds(default) else "null"
        found.append((key, f"{key}={_number(value)} must be {allowed.words()} (e.g. {example})"))
    return found


def require_in_bounds(cfg: Config) -> None:
    """ConfigError (one line, every bad value, keyed by the first) when a setting is out of range."""
    found = bound_problems(cfg)
    if found:
        raise ConfigError("; ".join(message for _, message in found), key=found[0][0])


# --- argparse types: the command line's numbers ---------------------------------------------------


def whole_number(least: int) -> Callable[[str], int]:
    """An argparse type for a whole number of at least `least`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {least}, got {text!r}")
        return value

    parse.__name__ = f"whole number >= {least}"
    return parse


count = whole_number(1)
"""Nodes, processes, tokens, iterations."""
non_negative_int = whole_number(0)
"""A rank, or a count where 0 means 'all' or 'none'."""


def tcp_port(text: str) -> int:
    if not text.strip().isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"must be a TCP port (1-65535), got {text!r}")
    return int(text)


def _real(allowed: Range) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not allowed.holds(value) or math.isinf(value):
            raise argparse.ArgumentTypeError(f"must be a number {allowed.words()}, got {text!r}")
        return value

    parse.__name__ = f"number {allowed.words()}"
    return parse


non_negative_float = _real(NON_NEGATIVE)
"""A temperature (0 = greedy)."""
positive_float = _real(POSITIVE)
"""Seconds to wait, a token count, a size."""
mebibytes = _real(Range(0.01))
"""A size of work in MiB: 10 KiB at least, so a slip of the decimal point is not a task per byte."""
