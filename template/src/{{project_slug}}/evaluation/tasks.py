"""Task evaluation on local files: the CORE score (DCLM's task bundle, as nanochat reports it).

    <package> eval --tasks core                       # every task of the bundle
    <package> eval --tasks hellaswag_zeroshot,piqa --max-per-task 200 --bundle /mnt/shared/eval_bundle

The bundle (fetched once on a machine with internet; README "Task evaluation") is read from
--bundle, by default <data.dir>/eval_bundle:

    core.yaml                icl_tasks: label, dataset_uri (under eval_data/), num_fewshot,
                             icl_task_type (multiple_choice | schema | language_modeling),
                             continuation_delimiter (default one space)
    eval_meta_data.csv       "Eval Task" and "Random baseline" (percent) of each task
    eval_data/**.jsonl       {query, choices, gold} | {context_options, continuation, gold} | {context, continuation}

Scoring: the few-shot examples of an item are drawn with a seed fixed per item, never the item
itself, and joined by blank lines before it. Multiple choice and schema pick the option with the
lowest mean loss over its continuation tokens; language modelling counts an item right only if
the greedy prediction reproduces every continuation token. A prompt longer than the model's
context is cut from the left. Accuracy is centred by the task's random baseline b, (acc - b)/(1 - b);
CORE is the mean of the centred accuracies. Items are dealt to the ranks and each is scored
alone, so the scores do not depend on the number of processes.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..runtime.distributed import all_reduce_sum
from ..settings.config import ConfigError

TASK_TYPES = ("multiple_choice", "schema", "language_modeling")
FIELDS = {
    "multiple_choice": ("query", "choices", "gold"),
    "schema": ("context_options", "continuation", "gold"),
    "language_modeling": ("context", "continuation"),
}
SHUFFLE_SEED, FEWSHOT_SEED = 1337, 1234


@dataclass
class Task:
    label: str
    kind: str
    num_fewshot: int
    delimiter: str
    baseline: float  # random accuracy, a fraction
    items: list[dict] = field(default_factory=list)


def _item_problem(kind: str, item) -> str:
    if not isinstance(item, dict):
        return "is not a JSON object"
    missing = [name for name in FIELDS[kind] if name not in item]
    if missing:
        return f"lacks {', '.join(missing)} (a {kind} item has {', '.join(FIELDS[kind])})"
    options = item.get("choices", item.get("context_options"))
    if kind != "language_modeling":
        if not isinstance(options, list) or not options:
            return "has no choices" if kind == "multiple_choice" else "has no context_options"
        gold = item["gold"]
        if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(options):
            return f"gold {gold!r} is out of range for its {len(options)} options"
    return ""


def _read_items(path: Path, kind: str) -> list[dict]:
    if not path.is_file():
        raise ConfigError(f"task file {path} is missing (dataset_uri in core.yaml, under eval_data/)")
    items = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if wrong := _item_problem(kind, item):
            raise ConfigError(f"{path}:{number}: the item {wrong}")
        items.append(item)
    if not items:
        raise ConfigError(f"{path} holds no items")
    return items


def _baselines(path: Path) -> dict[str, float]:
    if not path.is_file():
        raise ConfigError(f"{path} is missing: the bundle's random baselines (columns 'Eval Task', 'Random baseline')")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        return {row["Eval Task"]: float(row["Random baseline"]) / 100 for row in rows}
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{path}: needs the columns 'Eval Task' and 'Random baseline' (a percentage)") from None


def load_bundle(bundle: Path, wanted: list[str] | None = None) -> list[Task]:
    """The bundle's tasks (those named in `wanted`, default all), every file checked first."""
    import yaml

    spec_path = bundle / "core.yaml"
    if not spec_path.is_file():
        raise ConfigError(
            f"no task bundle at {bundle} (core.yaml missing): put the CORE bundle there (core.yaml, "
            "eval_meta_data.csv, eval_data/; README: Task evaluation) or pass --bundle"
        )
    try:
        specs = (yaml.safe_load(spec_path.read_text()) or {}).get("icl_tasks")
    except (yaml.YAMLError, AttributeError):
        specs = None
    if not isinstance(specs, list) or not specs:
        raise ConfigError(f"{spec_path}: needs a non-empty list icl_tasks")
    labels = [str(spec.get("label")) for spec in specs if isinstance(spec, dict)]
    unknown = sorted(set(wanted or []) - set(labels))
    if unknown:
        raise ConfigError(f"--tasks {', '.join(unknown)}: not in {spec_path}; its tasks: {', '.join(labels)}")
    baselines = _baselines(bundle / "eval_meta_data.csv")
    tasks = []
    for spec in specs:
        label = str(spec.get("label"))
        if wanted and label not in wanted:
            continue
        kind = spec.get("icl_task_type")
        if kind not in TASK_TYPES:
            raise ConfigError(
                f"{spec_path}: task {label}: icl_task_type {kind!r} is not one of {', '.join(TASK_TYPES)}"
            )
        if label not in baselines:
            raise ConfigError(f"{bundle / 'eval_meta_data.csv'}: no random baseline for task {label}")
        shots = spec.get("num_fewshot", 0)
        shots = shots[0] if isinstance(shots, list) and shots else shots
        if not isinstance(shots, int) or shots < 0:
            raise ConfigError(f"{spec_path}: task {label}: num_fewshot {shots!r} is not a whole number >= 0")
        items = _read_items(bundle / "eval_data" / str(spec.get("dataset_uri")), kind)
        delimiter = spec.get("continuation_delimiter", " ")
        tasks.append(Task(label, kind, shots, str(delimiter), baselines[label], items))
    return tasks


def options(task: Task, index: int) -> tuple[list[tuple[str, str]], int]:
    """(context, continuation) texts of each option of item `index`, and the gold option."""
    item, d = task.items[index], task.delimiter
    others = [i for i in range(len(task.items)) if i != index]
    shots = random.Random(FEWSHOT_SEED + index).sample(others, min(task.num_fewshot, len(others)))
    examples = []
    for i in shots:
        s = task.items[i]
        if task.kind == "multiple_choice":
            examples.append(f"{s['query']}{d}{s['choices'][s['gold']]}")
        elif task.kind == "schema":
            examples.append(f"{s['context_options'][s['gold']]}{d}{s['continuation']}")
        else:
            examples.append(f"{s['context']}{d}{s['continuation']}")
    prefix = "".join(f"{text}\n\n" for text in examples)
    if task.kind == "multiple_choice":
        return [(prefix + item["query"], f"{d}{choice}") for choice in item["choices"]], item["gold"]
    if task.kind == "schema":
        return [(prefix + context, f"{d}{item['continuation']}") for context in item["context_options"]], item["gold"]
    return [(prefix + item["context"], f"{d}{item['continuation']}")], 0


def encode_option(tok, bos: int, context: str, continuation: str, limit: int) -> tuple[list[int], int]:
    """Tokens of context + continuation after the separator, cut from the left to `limit` + 1, and
    where the continuation starts (the first token where they differ from the context's own)."""
    ctx = tok.encode(context, add_special_tokens=False).ids
    full = tok.encode(context + continuation, add_special_tokens=False).ids
    start = next((i for i, (a, b) in enumerate(zip(ctx, full)) if a != b), min(len(ctx), len(full)))
    ids = [bos, *full]
    start += 1
    cut = max(0, len(ids) - (limit + 1))
    return ids[cut:], max(start - cut, 1)


@torch.no_grad()
def score_item(model, tok, bos: int, task: Task, index: int, limit: int, device, autocast) -> bool:
    """Whether the model gets item `index` right (one batch of its options, right-padded)."""
    opts, gold = options(task, index)
    encoded = [encode_option(tok, bos, c, k, limit) for c, k in opts]
    width = max(len(ids) for ids, _ in encoded) - 1
    x = torch.zeros(len(encoded), width, dtype=torch.long)
    for row, (ids, _) in enumerate(encoded):
        x[row, : len(ids) - 1] = torch.tensor(ids[:-1])
    with autocast:
        logits = model(x.to(device)).float().cpu()
    losses, exact = [], []
    for row, (ids, start) in enumerate(encoded):
        targets = torch.tensor(ids[start:])
        predicted = logits[row, start - 1 : len(ids) - 1]
        losses.append(F.cross_entropy(predicted, targets).item())
        exact.append(bool((predicted.argmax(-1) == targets).all()))
    if task.kind == "language_modeling":
        return exact[0]
    return min(range(len(losses)), key=losses.__getitem__) == gold


def chosen_items(task: Task, max_per_task: int | None) -> list[int]:
    """Item indices to score: all, or the first max_per_task of a fixed shuffle."""
    order = list(range(len(task.items)))
    if max_per_task is None or max_per_task >= len(order):
        return order
    random.Random(SHUFFLE_SEED).shuffle(order)
    return sorted(order[:max_per_task])


def bundle_path(cfg) -> Path:
    """eval.bundle_dir, or the bundle beside the data (data.dir/eval_bundle)."""
    return Path(cfg.eval.bundle_dir) if cfg.eval.bundle_dir else Path(cfg.data.dir) / "eval_bundle"


def metrics_record(step: int, result: dict) -> dict:
    """One metrics.jsonl record (and TensorBoard scalars): CORE and each task's centred accuracy."""
    return {"step": step, "core": result["core"], **{f"tasks/{k}": s["centred"] for k, s in result["tasks"].items()}}


def centred(accuracy: float, baseline: float) -> float:
    return (accuracy - baseline) / (1 - baseline)


def evaluate_tasks(model, tok, bos: int, tasks: list[Task], limit: int, info, autocast, max_per_task=None) -> dict:
    """{"tasks": {label: accuracy, centred, items}, "core": mean centred}: items dealt round-robin
    over the ranks, right answers summed over them."""
    jobs = [(t, i) for t, task in enumerate(tasks) for i in chosen_items(task, max_per_task)]
    right = torch.zeros(len(tasks), dtype=torch.float64, device=info.device)
    was_training = model.training
    model.eval()
    mine = jobs[info.rank :: info.world_size]
    for t, i in mine:
        right[t] += score_item(model, tok, bos, tasks[t], i, limit, info.device, autocast)
    if len(mine) < -(-len(jobs) // info.world_size):
        # Every rank runs as many forwards: ZeRO-3 gathers the weights in each, all ranks together.
        score_item(model, tok, bos, tasks[jobs[0][0]], jobs[0][1], limit, info.device, autocast)
    all_reduce_sum(right)
    model.train(was_training)
    totals = [sum(1 for t, _ in jobs if t == k) for k in range(len(tasks))]
    scores = {}
    for k, task in enumerate(tasks):
        accuracy = right[k].item() / totals[k]
        scores[task.label] = {
            "accuracy": accuracy,
            "centred": centred(accuracy, task.baseline),
            "items": totals[k],
        }
    return {"tasks": scores, "core": sum(s["centred"] for s in scores.values()) / len(scores)}


def table(result: dict) -> str:
    width = max(len("task"), *(len(label) for label in result["tasks"]))
    lines = [f"{'task':<{width}}  accuracy  centred  items"]
    for label, s in result["tasks"].items():
        lines.append(f"{label:<{width}}  {s['accuracy']:8.4f}  {s['centred']:7.4f}  {s['items']:5d}")
    lines.append(f"{'CORE':<{width}}  {'':8}  {result['core']:7.4f}")
    return "\n".join(lines)
