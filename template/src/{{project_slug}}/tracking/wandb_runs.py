"""Weights & Biases: one W&B run per run folder, in the project WANDB_PROJECT (else the project's
name). Online where WANDB_API_KEY is set (WANDB_BASE_URL for a server of your own), else offline:
the run is written under output_dir/wandb, and `wandb sync <that folder>/offline-run-*` uploads it
later, from a machine with network. WANDB_MODE, where set, decides. A resumed run continues the
same W&B run (its id in trackers.json); W&B keeps steps increasing, so steps a dead attempt logged
after its checkpoint keep that attempt's values there (metrics.jsonl has the redone ones)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from . import identity


class WandbRun:
    name = "wandb"

    def __init__(self, cfg, output_dir: Path, resume_step: int):
        self.cfg, self.output_dir = cfg, output_dir
        self.run = None

    def start(self) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        saved = identity.recalled(self.output_dir, self.name)
        run_id = saved.get("id") or uuid.uuid4().hex[:8]  # W&B's own ids: 8 of [0-9a-z]
        project, run_name = identity.run_names(self.output_dir)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or project,
            name=run_name,
            id=run_id,
            resume="allow",
            dir=str(self.output_dir),
            mode=mode,
            config=identity.parameters(self.cfg),
            settings=wandb.Settings(silent=True, console="off"),
        )
        identity.remember(self.output_dir, self.name, {"id": run_id})

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)
