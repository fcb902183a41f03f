"""What the project knows of a job, for when its platform no longer does.

A scheduler without accounting forgets a job minutes after it ends, a cluster's job resource is
deleted after its TTL or by hand, a cloud task can be deleted: `--action status` then answers from
what this project holds, and says so:

    .jobs/<platform>-seen.jsonl     one line each time status or logs saw the job (its state, the
                                    last training line and end line logs printed) or cancel acted
    the job's log file              (where it lies on the shared file system) its last training line
    <run.output_dir>/               metrics.jsonl's last step, the newest checkpoint, preempted.json,
                                    eval.json: where the run is, whether it reached max_steps

The run folder is read where this machine sees it (a cluster job's output_dir is often on storage
only its nodes mount); each record names the job's output_dir and max_steps at submission.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..settings.config import Config, under_root
from ..settings.stored_files import read_json_lines, warn
from . import jobs
from .jobs import Job

# What every platform keeps of the run in a record's `extra` (checked on reading, as the rest).
RUN_FIELDS = {"output_dir": str, "max_steps": (int, None)}

# A training line as the loop prints it (training/metrics.py format_step), after any prefix a
# launcher adds ([default0]:, a pod's name), and the loop's last word on a run.
TRAINING_LINE = re.compile(r"\bstep +\d+/\S+ \| loss .*")
END_LINE = re.compile(r"\b(?:done: metrics in .*|preempted \(.*)")

SEEN_KEYS = {"id": str, "at": str}
SEEN_OPTIONAL = {"action": str, "state": str, "line": str, "end": str}


def run_fields(cfg: Config, output_dir: str | Path | None = None) -> dict:
    """The `extra` entries a submission records: where the run writes (default: run.output_dir as
    the job sees it), and how far it goes (schedule.epochs: the steps the prepared data gives, None
    until it is prepared or where this machine does not see it)."""
    from ..data.epochs import steps_where_known

    max_steps = steps_where_known(cfg, under_root(cfg.data.dir))[0].schedule.max_steps
    return {"output_dir": str(output_dir or cfg.run.output_dir), "max_steps": max_steps}


def seen_path(platform: str) -> Path:
    return jobs.records_path(platform).with_name(f"{platform}-seen.jsonl")


class LogWatcher:
    """Keeps the last training line and end line of text printed in chunks (lines may span them)."""

    def __init__(self) -> None:
        self.line: str | None = None
        self.end: str | None = None
        self._partial = ""

    def feed(self, text: str) -> None:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._look(line)

    def close(self) -> None:
        if self._partial:
            self._look(self._partial)
            self._partial = ""

    def _look(self, line: str) -> None:
        line = line.rstrip("\r")
        if found := TRAINING_LINE.search(line):
            self.line = found.group(0).rstrip()
        elif found := END_LINE.search(line):
            self.end = found.group(0).rstrip()


def remember(job: Job, action: str, state: str | None = None, watcher: LogWatcher | None = None) -> None:
    """Append what status or logs just saw of the job, or what cancel did to it; a project that cannot be
    written only loses it."""
    if watcher is not None:
        watcher.close()
    entry = {"id": job.id, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "action": action}
    for key, value in (("state", state), ("line", watcher and watcher.line), ("end", watcher and watcher.end)):
        if value:
            entry[key] = value
    if len(entry) == 3:
        return  # nothing seen
    path = seen_path(job.platform)
    try:
        path.parent.mkdir(exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            grown = f.tell() > COMPACT_BYTES
        if grown:
            compact(path)
    except OSError:
        pass  # the answer was printed; only a later answer from the records misses it


# `watch launch <platform> --action status` appends a line every few seconds: past this size the file is
# rewritten with one line per job (its newest state, line and end).
COMPACT_BYTES = 1 << 20


def compact(path: Path) -> None:
    records, _ = read_json_lines(path, SEEN_KEYS, SEEN_OPTIONAL)
    merged: dict[str, dict] = {}
    for entry in records:
        kept = merged.setdefault(entry["id"], {})
        if entry.get("state"):
            kept.update(id=entry["id"], at=entry["at"], action=entry.get("action", ""), state=entry["state"])
        kept.update({key: entry[key] for key in ("line", "end") if entry.get(key)})
        kept.setdefault("id", entry["id"])
        kept.setdefault("at", entry["at"])
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(json.dumps(entry) + "\n" for entry in merged.values()))
    partial.replace(path)


@dataclass
class Seen:
    """The newest of each thing seen of one job (from different calls: status sees states, logs lines)."""

    state: str | None = None
    state_at: str = ""
    state_by: str = ""
    line: str | None = None
    end: str | None = None
    entries: int = 0


def last_seen(job: Job) -> Seen:
    records, warnings = read_json_lines(seen_path(job.platform), SEEN_KEYS, SEEN_OPTIONAL)
    for warning in warnings:
        warn(warning)
    seen = Seen()
    for entry in records:
        if entry["id"] != job.id:
            continue
        seen.entries += 1
        if entry.get("state"):
            seen.state, seen.state_at, seen.state_by = entry["state"], entry["at"], entry.get("action", "")
        seen.line = entry.get("line") or seen.line
        seen.end = entry.get("end") or seen.end
    return seen


def log_lines(path: Path, tail_bytes: int = 1 << 20) -> LogWatcher:
    """The last training and end lines of a log file (its last MiB: a long run's log is large)."""
    watcher = LogWatcher()
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(size - tail_bytes, 0))
            watcher.feed(f.read().decode("utf-8", errors="replace"))
    except OSError:
        pass
    watcher.close()
    return watcher


def run_folder(job: Job, fallback: str | Path | None = None) -> Path | None:
    """The job's output_dir as its record names it (relative: under the project), else `fallback`."""
    named = job.extra.get("output_dir") or fallback
    return under_root(named) if named else None


def run_lines(output_dir: Path, max_steps: int | None) -> list[str]:
    """Where the run in output_dir is: its last step, validation, newest checkpoint, a stop on a
    signal, and whether it reached max_steps; [] when the folder holds none of them."""
    from ..checkpoints.checkpoint_files import named_by_latest, step_of
    from ..training.metrics import format_step, latest_records
    from ..training.preemption import read_marker

    lines = []
    train, val = latest_records(output_dir)
    if train:
        lines.append(f"latest: {format_step(train, max_steps or '?')}")
    if val:
        lines.append(f"validation: step {val['step']}, loss {val['val_loss']:.4f}")
    latest = named_by_latest(output_dir / "checkpoints")  # None when damaged
    if latest is not None:
        lines.append(f"checkpoint: {latest}")
    stop = read_marker(output_dir, since=0.0)  # a damaged marker is a warning
    if stop:
        lines.append(f"stopped by {stop['signal']} at step {stop['step']} (saved; run again to resume)")
    steps = [step for step in (train and train["step"], latest and step_of(latest)) if step]
    if max_steps and steps:
        reached = max(steps)
        lines.append(
            f"finished: reached max_steps {max_steps}"
            if reached >= max_steps
            else f"finished: no, step {reached} of max_steps {max_steps}"
        )
    evaluated = output_dir / "eval.json"
    if evaluated.is_file():
        lines.append(f"evaluated: {evaluated}")
    return lines


def answer_from_records(job: Job, forgotten: str, log: Path | None = None, output_dir: Path | None = None) -> int:
    """Print what the project knows of a job its platform has forgotten (`forgotten` says why the
    platform does not answer); 0 when something is known, 1 when nothing is."""
    seen = last_seen(job)
    found = log_lines(log) if log else LogWatcher()
    lines = []
    if seen.state:
        by = f" (--action {seen.state_by})" if seen.state_by else ""
        lines.append(f"last seen: {seen.state} at {seen.state_at}{by}")
    if log:
        lines.append(f"log: {log}" + ("" if log.is_file() else " (not on this machine)"))
    line, end = found.line or seen.line, found.end or seen.end
    if line:
        lines.append(f"last line: {line}")
    if end:
        lines.append(f"last word: {end}")
    known = bool(seen.state or line or end)
    if output_dir is not None:
        if output_dir.is_dir():
            run = run_lines(output_dir, job.extra.get("max_steps"))
            known = known or bool(run)
            lines += [f"run folder: {output_dir}"] + run
        else:
            lines.append(f"run folder: {output_dir} (not on this machine: the job's storage holds it)")
    print(f"  {forgotten}")
    if not known:
        print("  and this project holds nothing of it: no status or logs seen, no log line, no run folder here")
        return 1
    print("  from this project's records:")
    for entry in lines:
        print(f"  {entry}")
    return 0
