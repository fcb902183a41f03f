"""A small English corpus made from text already on every machine: the docstrings of Python's
standard library (about 1 MB). It stands in for real data in the CPU demo and the tests, so
nothing is downloaded. Parsed with `ast`, never imported, so no module runs.
"""

from __future__ import annotations

import ast
import functools
import json
import random
import sysconfig
from pathlib import Path

_SKIP = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3"}


def file_docstrings(path: Path) -> list[str]:
    """The docstrings of a Python file's module, classes and functions, in walk order (none if it
    does not parse)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [doc for node in ast.walk(tree) if isinstance(node, nodes) and (doc := ast.get_docstring(node))]


@functools.cache  # about 6 s of parsing: the corpus and the task bundle share one pass
def stdlib_docstrings(min_chars: int = 100) -> tuple[str, ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if not _SKIP.intersection(path.relative_to(root).parts):
            docs += [doc for doc in file_docstrings(path) if len(doc) >= min_chars]
    return tuple(docs)


def write_demo_corpus(raw_dir: Path) -> Path:
    """Write the corpus as jsonl with a "text" field, the format prepare-data reads."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    out = raw_dir / "stdlib_docstrings.jsonl"
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for doc in stdlib_docstrings():
            f.write(json.dumps({"text": doc}) + "\n")
    tmp.replace(out)
    return out


def write_demo_bundle(bundle: Path, items_per_task: int = 40) -> Path:
    """A small task bundle in CORE's layout made from the same docstrings (so `eval --tasks core` and
    eval.tasks_every_steps have something to score offline): the next word (language modelling), the
    next three words among four (multiple choice), and which opening a continuation belongs to
    (schema). Written whole into a new folder, never over an existing one."""
    texts = [" ".join(doc.split()) for doc in stdlib_docstrings() if len(doc) >= 200]
    pick = random.Random(1337)
    starts = [text.split() for text in pick.sample(texts, 3 * items_per_task + 3)]
    lm = [{"context": " ".join(w[:8]), "continuation": w[8]} for w in starts[:items_per_task]]
    mc = []
    for i, w in enumerate(starts[items_per_task : 2 * items_per_task]):
        wrong = [" ".join(starts[(i + k) % len(starts)][8:11]) for k in (1, 2, 3)]
        gold = pick.randrange(4)
        mc.append(
            {"query": " ".join(w[:8]), "choices": wrong[:gold] + [" ".join(w[8:11])] + wrong[gold:], "gold": gold}
        )
    schema = []
    for i, w in enumerate(starts[2 * items_per_task : 3 * items_per_task]):
        other, gold = starts[(i + 7) % len(starts)], pick.randrange(2)
        options = [" ".join(other[:6])] * 2
        options[gold] = " ".join(w[:6])
        schema.append({"context_options": options, "continuation": " ".join(w[6:10]), "gold": gold})
    tasks = {"docstring_next_word": ("language_modeling", lm, 0), "docstring_next_words": ("multiple_choice", mc, 25)}
    tasks["docstring_opening"] = ("schema", schema, 50)
    tmp = bundle.with_name(bundle.name + ".tmp")
    (tmp / "eval_data").mkdir(parents=True, exist_ok=True)
    specs, rows = [], ["Eval Task,Random baseline"]
    for label, (kind, items, baseline) in tasks.items():
        (tmp / "eval_data" / f"{label}.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
        specs.append(
            f"  - label: {label}\n    dataset_uri: {label}.jsonl\n    num_fewshot: [2]\n    icl_task_type: {kind}\n"
        )
        rows.append(f"{label},{baseline}")
    (tmp / "core.yaml").write_text("icl_tasks:\n" + "".join(specs))
    (tmp / "eval_meta_data.csv").write_text("\n".join(rows) + "\n")
    tmp.rename(bundle)
    return bundle
