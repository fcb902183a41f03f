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
CORE is the mean of the centred accuracies. The options of all items are batched by length in
batches fixed by the bundle alone, dealt to the ranks, so the scores do not depend on the number of
processes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..runtime.distributed import all_reduce_sum
from ..settings.bounds import shown
from ..settings.config import ConfigError
from ..settings.stored_files import read_text, read_yaml

TASK_TYPES = ("multiple_choice", "schema", "language_modeling")
FIELDS = {
    "multiple_choice": ("query", "choices", "gold"),
    "schema": ("context_options", "continuation", "gold"),
    "language_modeling": ("context", "continuation"),
}
SHUFFLE_SEED, FEWSHOT_SEED = 1337, 1234
GPU_BATCH_TOKENS = 16384  # padded tokens per forward on a GPU (logits: this x vocabulary x 2-4 bytes)


@dataclass
class Task:
    label: str
    kind: str
    num_fewshot: int
    delimiter: str
    baseline: float  # random accuracy, a fraction
    items: list[dict] = field(default_factory=list)
    path: Path | None = None  # the task file, and each item's line in it, to name an item that cannot be scored
    lines: list[int] = field(default_factory=list)

    def where(self, index: int) -> str:
        return f"{self.path}:{self.lines[index]}" if self.path and index < len(self.lines) else f"task {self.label}"


TEXT_FIELDS = ("query", "context", "continuation")  # text the model reads: a number would be scored as its digits
OPTION_FIELDS = ("choices", "context_options")  # lists of such text


def _item_problem(kind: str, item) -> str:
    if not isinstance(item, dict):
        return "is not a JSON object"
    missing = [name for name in FIELDS[kind] if name not in item]
    if missing:
        return f"lacks {', '.join(missing)} (a {kind} item has {', '.join(FIELDS[kind])})"
    for name in FIELDS[kind]:
        if name in TEXT_FIELDS and not isinstance(item[name], str):
            return f"{name} {shown(repr(item[name]), quoted=False)} is not text"
        if name in OPTION_FIELDS and isinstance(item[name], list) and not all(isinstance(o, str) for o in item[name]):
            return f"{name} holds an option that is not text"
    # What is scored: an empty one has no tokens to score (the loss of nothing), or only the delimiter.
    if "continuation" in FIELDS[kind] and not item["continuation"].strip():
        return f"continuation {shown(repr(item['continuation']), quoted=False)} is empty: there is nothing to score"
    if kind == "multiple_choice" and isinstance(item["choices"], list) and not all(c.strip() for c in item["choices"]):
        return "choices holds an empty option: there is nothing to score for it"
    options = item.get("choices", item.get("context_options"))
    if kind != "language_modeling":
        if not isinstance(options, list) or not options:
            return "has no choices" if kind == "multiple_choice" else "has no context_options"
        gold = item["gold"]
        if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(options):
            return f"gold {shown(repr(gold), quoted=False)} is out of range for its {len(options)} options"
    return ""


def _read_items(path: Path, kind: str) -> tuple[list[dict], list[int]]:
    """The file's items and the line each stands on."""
    if not path.is_file():
        raise ConfigError(f"task file {path} is missing (dataset_uri in core.yaml, under eval_data/)")
    items, lines = [], []
    for number, line in enumerate(read_text(path, "save it as UTF-8 JSON lines").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if wrong := _item_problem(kind, item):
            raise ConfigError(f"{path}:{number}: the item {wrong}; correct or remove that line")
        items.append(item)
        lines.append(number)
    if not items:
        raise ConfigError(f"{path} holds no items")
    return items, lines


def _baselines(path: Path) -> dict[str, float]:
    if not path.is_file():
        raise ConfigError(f"{path} is missing: the bundle's random baselines (columns 'Eval Task', 'Random baseline')")
    rows = list(csv.DictReader(io.StringIO(read_text(path, "save it as UTF-8 CSV"), newline="")))
    try:
        baselines = {row["Eval Task"]: float(row["Random baseline"]) / 100 for row in rows}
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{path}: needs the columns 'Eval Task' and 'Random baseline' (a percentage)") from None
    for label, baseline in baselines.items():
        # centred accuracy divides by 1 - baseline: 100% would leave nothing to divide by, NaN make CORE NaN
        if not (math.isfinite(baseline) and 0 <= baseline < 1):
            raise ConfigError(
                f"{path}: task {label}: Random baseline {baseline * 100:g} is not a percentage from 0 up to "
                "(not including) 100"
            )
    return baselines


def load_bundle(bundle: Path, wanted: list[str] | None = None) -> list[Task]:
    """The bundle's tasks (those named in `wanted`, default all), every file checked first."""
    spec_path = bundle / "core.yaml"
    if not spec_path.is_file():
        raise ConfigError(
            f"no task bundle at {bundle} (core.yaml missing): put the CORE bundle there (core.yaml, "
            "eval_meta_data.csv, eval_data/; README: Task evaluation) or pass --bundle"
        )
    spec = read_yaml(spec_path, "needs a non-empty list icl_tasks")
    specs = spec.get("icl_tasks") if isinstance(spec, dict) else None
    if not isinstance(specs, list) or not specs:
        raise ConfigError(f"{spec_path}: needs a non-empty list icl_tasks")
    entry = next((e for e in specs if not isinstance(e, dict) or not isinstance(e.get("label"), str)), None)
    if entry is not None:
        raise ConfigError(
            f"{spec_path}: icl_tasks entry {shown(repr(entry), quoted=False)} is not a mapping with a text label"
        )
    labels = [spec["label"] for spec in specs]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ConfigError(f"{spec_path}: task label(s) {', '.join(twice)} appear more than once; labels name one task")
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
        shots = shots[0] if isinstance(shots, list) and len(shots) == 1 else shots
        if not isinstance(shots, int) or isinstance(shots, bool) or shots < 0:
            raise ConfigError(
                f"{spec_path}: task {label}: num_fewshot {shown(repr(shots), quoted=False)} is not a whole number >= 0"
            )
        uri = spec.get("dataset_uri")
        if not isinstance(uri, str) or not uri:
            raise ConfigError(
                f"{spec_path}: task {label}: dataset_uri {shown(repr(uri), quoted=False)} is not a file name under eval_data/"
            )
        delimiter = spec.get("continuation_delimiter", " ")
        if not isinstance(delimiter, str):  # null would be scored as the text "None" between context and answer
            raise ConfigError(
                f"{spec_path}: task {label}: continuation_delimiter {shown(repr(delimiter), quoted=False)} is not text; "
                "leave it out for one space"
            )
        path = bundle / "eval_data" / uri
        items, lines = _read_items(path, kind)
        tasks.append(Task(label, kind, shots, delimiter, baselines[label], items, path, lines))
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
    where the continuation starts (the first token where they differ from the context's own).
    ValueError where the continuation adds no token (a tokenizer that drops its characters)."""
    ctx = tok.encode(context, add_special_tokens=False).ids
    full = tok.encode(context + continuation, add_special_tokens=False).ids
    start = next((i for i, (a, b) in enumerate(zip(ctx, full)) if a != b), min(len(ctx), len(full)))
    if start >= len(full):
        raise ValueError(f"the continuation {shown(continuation)} adds no token to its context")
    ids = [bos, *full]
    start += 1
    cut = max(0, len(ids) - (limit + 1))
    return ids[cut:], max(start - cut, 1)


@dataclass
class Row:
    """One option of one item: its tokens and where the continuation starts."""

    job: int
    ids: list[int]
    start: int


def rows_of(tok, bos: int, tasks: list[Task], jobs: list[tuple[int, int]], limit: int) -> tuple[list[Row], list[int]]:
    """Every option of every job as a Row, and each job's gold option."""
    rows, golds = [], []
    for job, (t, i) in enumerate(jobs):
        opts, gold = options(tasks[t], i)
        golds.append(gold)
        try:
            rows += [Row(job, *encode_option(tok, bos, c, k, limit)) for c, k in opts]
        except ValueError as exc:
            raise ConfigError(
                f"{tasks[t].where(i)}: the item cannot be scored: {exc} under this tokenizer; correct or remove that line"
            ) from None
    return rows, golds


def length_batches(rows: list[Row], tokens_per_batch: int) -> list[list[int]]:
    """Row indices in batches of similar length (longest first), each at most tokens_per_batch
    padded tokens. Fixed by the rows alone: a row is computed in the same batch on any number of
    ranks, so the scores do not depend on it."""
    order = sorted(range(len(rows)), key=lambda r: (-len(rows[r].ids), r))
    batches, current = [], []
    for r in order:
        width = len(rows[current[0]].ids) if current else len(rows[r].ids)
        if current and (len(current) + 1) * width > tokens_per_batch:
            batches.append(current)
            current = []
        current.append(r)
    return batches + ([current] if current else [])


@torch.no_grad()
def score_batch(model, rows: list[Row], batch: list[int], device, autocast) -> tuple[list[float], list[bool]]:
    """Mean continuation loss and exact greedy match of each row of a right-padded batch."""
    width = max(len(rows[r].ids) for r in batch) - 1
    x = torch.zeros(len(batch), width, dtype=torch.long)
    for n, r in enumerate(batch):
        x[n, : len(rows[r].ids) - 1] = torch.tensor(rows[r].ids[:-1])
    with autocast:
        logits = model(x.to(device))
    losses, exact = [], []
    for n, r in enumerate(batch):  # on the device: only two numbers per row come back
        ids, start = rows[r].ids, rows[r].start
        targets, predicted = torch.tensor(ids[start:], device=device), logits[n, start - 1 : len(ids) - 1].float()
        losses.append(F.cross_entropy(predicted, targets))
        exact.append((predicted.argmax(-1) == targets).all())
    return torch.stack(losses).tolist(), torch.stack(exact).tolist()


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


def evaluate_tasks(
    model, tok, bos: int, tasks: list[Task], limit: int, info, autocast, max_per_task=None, tokens_per_batch=None
) -> dict:
    """{"tasks": {label: accuracy, centred, items}, "core": mean centred}. The options of every item
    are batched by length (length_batches), the batches dealt round-robin over the ranks, and each
    row's loss and greedy match summed over them, so every rank decides every item alike."""
    jobs = [(t, i) for t, task in enumerate(tasks) for i in chosen_items(task, max_per_task)]
    rows, golds = rows_of(tok, bos, tasks, jobs, limit)
    # A GPU is bound by launches, a CPU by work (padding costs it more than batching saves).
    if tokens_per_batch is None:
        tokens_per_batch = GPU_BATCH_TOKENS if info.device.type == "cuda" else 1
    batches = length_batches(rows, tokens_per_batch)
    found = torch.zeros(2, len(rows), dtype=torch.float64, device=info.device)  # loss, exact
    was_training = model.training
    model.eval()
    mine = batches[info.rank :: info.world_size]
    for batch in mine:
        losses, exact = score_batch(model, rows, batch, info.device, autocast)
        found[0, batch] = torch.tensor(losses, dtype=torch.float64, device=info.device)
        found[1, batch] = torch.tensor(exact, dtype=torch.float64, device=info.device)
    if len(mine) < -(-len(batches) // info.world_size):
        # Every rank runs as many forwards: a strategy that shards the weights gathers them in each,
        # all ranks together.
        score_batch(model, rows, batches[0][:1], info.device, autocast)
    all_reduce_sum(found)
    model.train(was_training)
    losses, exact = found[0].tolist(), found[1].tolist()
    per_job: list[list[int]] = [[] for _ in jobs]
    for r, row in enumerate(rows):
        per_job[row.job].append(r)
    right, totals = [0] * len(tasks), [0] * len(tasks)
    for job, (t, _) in enumerate(jobs):
        mine_rows = per_job[job]
        if tasks[t].kind == "language_modeling":
            correct = exact[mine_rows[0]] == 1.0
        else:
            correct = min(range(len(mine_rows)), key=lambda k: losses[mine_rows[k]]) == golds[job]
        right[t] += correct
        totals[t] += 1
    scores = {}
    for k, task in enumerate(tasks):
        accuracy = right[k] / totals[k]
        scores[task.label] = {"accuracy": accuracy, "centred": centred(accuracy, task.baseline), "items": totals[k]}
    return {"tasks": scores, "core": sum(s["centred"] for s in scores.values()) / len(scores)}


def table(result: dict) -> str:
    width = max(len("task"), *(len(label) for label in result["tasks"]))
    lines = [f"{'task':<{width}}  accuracy  centred  items"]
    for label, s in result["tasks"].items():
        lines.append(f"{label:<{width}}  {s['accuracy']:8.4f}  {s['centred']:7.4f}  {s['items']:5d}")
    lines.append(f"{'CORE':<{width}}  {'':8}  {result['core']:7.4f}")
    return "\n".join(lines)
