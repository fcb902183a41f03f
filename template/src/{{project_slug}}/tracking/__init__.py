"""Experiment trackers: where a run's metrics go besides metrics.jsonl (logging.trackers).

    check_installed(cfg)                     # every rank, before the run: a missing package is one line
    trackers = open_trackers(cfg, out, resume_step)   # rank 0: started in the background
    for t in trackers: t.log(step, {"loss": 2.1, ...}); ...; t.close()

- tensorboard: event files in output_dir/tensorboard (tensorboard_events.py).
- mlflow: MLFLOW_TRACKING_URI (with MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN from the platform's
  secrets), else a file store in output_dir/mlruns (mlflow_runs.py).
- wandb: online where WANDB_API_KEY is set, else offline in output_dir/wandb for `wandb sync` later
  (wandb_runs.py).

Rank 0 alone logs. The resolved config is each run's parameters, every metrics.jsonl record its
metrics at its step. A resumed or resized run continues the same tracker run: the ids are kept in
output_dir/trackers.json (identity.py). A tracker works on a thread of its own (background.py): a
slow or unreachable server, bad credentials or a full disk there cost one warning line and that
tracker, never a step of training; metrics.jsonl holds everything regardless.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..settings.config import Config
from ..settings.packages import require_package
from .background import BackgroundTracker

# logging.trackers name -> (its package, the project's extra that installs it, module.class here)
TRACKERS = {
    "tensorboard": ("tensorboard", "", "tensorboard_events.TensorBoardEvents"),
    "mlflow": ("mlflow", "mlflow", "mlflow_runs.MlflowRun"),
    "wandb": ("wandb", "wandb", "wandb_runs.WandbRun"),
}


def chosen(cfg: Config) -> list[str]:
    """logging.trackers, without tensorboard where an older config switched it off (logging.tensorboard)."""
    return [name for name in cfg.logging.trackers if name != "tensorboard" or cfg.logging.tensorboard]


def check_installed(cfg: Config) -> None:
    """A ConfigError naming the install command for a chosen tracker whose package is missing (on every
    rank, at the same point: no rank waits for one that stopped)."""
    for name in chosen(cfg):
        module, extra, _ = TRACKERS[name]
        require_package(module, extra, f"logging.trackers={name}", f"or leave {name} out of logging.trackers")


def open_trackers(cfg: Config, output_dir: Path, resume_step: int) -> list[BackgroundTracker]:
    """The chosen trackers, each starting on its own thread (rank 0 only)."""
    trackers = []
    for name in chosen(cfg):
        module, kind = TRACKERS[name][2].split(".")
        tracker = getattr(importlib.import_module(f".{module}", __name__), kind)
        trackers.append(BackgroundTracker(tracker(cfg, output_dir, resume_step)))
    return trackers
