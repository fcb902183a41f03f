"""Which tracker run a run folder logs to: output_dir/trackers.json, {tracker: {its ids}}. A resumed
or resized run reads it and continues the same tracker run; a new run folder starts new ones."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

FILE = "trackers.json"
_writing = threading.Lock()  # each tracker saves from its own thread


def recalled(output_dir: Path, tracker: str) -> dict:
    """The ids `tracker` saved in this run folder, or {} (none, or a file that cannot be read)."""
    try:
        saved = json.loads((output_dir / FILE).read_text())
    except (OSError, ValueError):
        return {}
    entry = saved.get(tracker) if isinstance(saved, dict) else None
    return entry if isinstance(entry, dict) else {}


def remember(output_dir: Path, tracker: str, ids: dict) -> None:
    """Save `tracker`'s ids beside the others (whole or not at all: written aside, then renamed)."""
    path = output_dir / FILE
    with _writing:
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        saved = saved if isinstance(saved, dict) else {}
        saved[tracker] = ids
        aside = path.with_name(f".{FILE}.tmp")
        aside.write_text(json.dumps(saved, indent=1) + "\n")
        os.replace(aside, path)


def run_names(output_dir: Path) -> tuple[str, str]:
    """(project, run): the package's name and the run folder's."""
    return __package__.split(".")[0], output_dir.resolve().name


def parameters(cfg) -> dict[str, str]:
    """The resolved config as flat `section.key` -> text parameters."""
    flat = {}
    for section, values in cfg.to_dict().items():
        for key, value in values.items():
            flat[f"{section}.{key}"] = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return flat
