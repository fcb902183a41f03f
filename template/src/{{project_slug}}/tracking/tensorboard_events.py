"""TensorBoard: event files in output_dir/tensorboard. A resumed run hides the events a dead
attempt wrote after its checkpoint (purge_step), so every step shows once."""

from __future__ import annotations

from pathlib import Path


class TensorBoardEvents:
    name = "tensorboard"

    def __init__(self, cfg, output_dir: Path, resume_step: int):
        self.folder, self.resume_step = output_dir / "tensorboard", resume_step
        self.writer = None

    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.folder), purge_step=self.resume_step + 1)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self, finished: bool) -> None:
        self.writer.close()
