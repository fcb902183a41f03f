"""Throughput, model FLOPs utilisation and the metric sinks (console, metrics.jsonl, the trackers).

MFU = achieved model FLOPs / peak dense FLOPs of all GPUs in the run's 16-bit precision (bf16 or
fp16; an fp32 run is measured against the GPU's 16-bit peak too). Peaks come from gpus.py (vendor
figures without sparsity); an unknown device (CPU included) reports MFU as null rather than a made-up
number. Under fp16 each record also holds loss_scale and skipped: the optimizer steps the loss scaler
has skipped so far in the run (their gradients overflowed; no update was made).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..settings.gpus import peak_for_device_name
from ..settings.stored_files import read_json_lines

# torch only where a GPU is asked its name: `launch <platform> --action status` reads the lines without it.
if TYPE_CHECKING:
    import torch


def peak_flops(device: torch.device, precision: str | None = None) -> float | None:
    if device.type != "cuda":
        return None
    import torch

    return peak_for_device_name(torch.cuda.get_device_name(device), precision)


def mfu(flops_per_token: float, tokens_per_sec: float, num_gpus: int, peak: float | None) -> float | None:
    if not peak:
        return None
    return flops_per_token * tokens_per_sec / (peak * num_gpus)


class MetricsLogger:
    """Appends one JSON object per logged step to metrics.jsonl and hands its numbers to the trackers
    (tracking/: TensorBoard, MLflow, W&B, each on a thread of its own). Created with enabled=False on
    ranks other than 0, where every call is a no-op."""

    def __init__(self, output_dir: Path, enabled: bool, cfg, resume_step: int = 0):
        """resume_step: the step training continues from; records after it (logged by an attempt
        that stopped before its next checkpoint) are dropped, so every step appears once."""
        self.enabled = enabled
        self.trackers = []
        if not enabled:
            return
        output_dir.mkdir(parents=True, exist_ok=True)
        path = output_dir / "metrics.jsonl"
        drop_records_after(path, resume_step)
        self.jsonl = path.open("a", encoding="utf-8")
        from ..tracking import open_trackers

        self.trackers = open_trackers(cfg, output_dir, resume_step)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        numbers = {
            k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        for tracker in self.trackers:
            tracker.log(record["step"], numbers)

    def close(self) -> None:
        if self.enabled:
            self.jsonl.close()
            for tracker in self.trackers:
                tracker.close()


def drop_records_after(path: Path, step: int) -> None:
    """Rewrite metrics.jsonl without records past `step`, nor a line torn by a kill (atomically:
    the new file is renamed over the old one)."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if (_record_step(line) or step + 1) <= step]
    if len(kept) != len(lines):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)


def _record_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


# The shape of a metrics.jsonl record as read back: `step` always; a training step's loss, lr,
# tokens_per_sec and step_time; an evaluation's val_loss. A line of another shape (or torn while the
# run writes) is passed over.
RECORD_KEYS = {"step": int}
RECORD_FIELDS = {
    **dict.fromkeys(("loss", "lr", "tokens_per_sec", "step_time", "val_loss", "loss_scale"), float),
    "mfu": (float, None),
    "skipped": int,
}
TRAINING_FIELDS = {"loss", "lr", "tokens_per_sec", "step_time"}  # what format_step shows


def latest_records(output_dir: Path) -> tuple[dict | None, dict | None]:
    """(latest training record, latest validation record) of the run's metrics.jsonl."""
    records, _ = read_json_lines(output_dir / "metrics.jsonl", RECORD_KEYS, RECORD_FIELDS)
    train = next((r for r in reversed(records) if TRAINING_FIELDS <= r.keys()), None)
    val = next((r for r in reversed(records) if "val_loss" in r), None)
    return train, val


def format_step(record: dict, max_steps: int) -> str:
    parts = [f"step {record['step']:>6}/{max_steps}", f"loss {record['loss']:.4f}", f"lr {record['lr']:.2e}"]
    parts.append(f"{record['tokens_per_sec']:,.0f} tok/s")
    if record.get("mfu") is not None:
        parts.append(f"mfu {100 * record['mfu']:.1f}%")
    parts.append(f"{1000 * record['step_time']:.0f} ms/step")
    if "loss_scale" in record:
        parts.append(f"loss scale {record['loss_scale']:g}, {record.get('skipped', 0)} skipped")
    if record.get("not_applied"):
        n = record["not_applied"]
        parts.append(f"{n} step{'s' if n > 1 else ''} not applied")
    return " | ".join(parts)
