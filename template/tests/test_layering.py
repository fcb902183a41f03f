"""Which modules may import what: models know nothing of distribution, sample does not need eval.

Read from the source (every import statement, also those inside functions), so an import that runs
only on some code path counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PARALLEL_APIS = ("deepspeed", "torch.distributed", "torch.nn.parallel")


def imported_names(path: Path) -> set[str]:
    """Every module an import statement of the file names; relative ones as written ('.evaluate')."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            names.add(module)
            names.update(f"{module}.{alias.name}" if node.module else module + alias.name for alias in node.names)
    return names


def package_dir(pkg) -> Path:
    return Path(pkg.module("models").__file__).parents[1]


def test_models_import_no_parallel_api(pkg):
    models = sorted((package_dir(pkg) / "models").glob("*.py"))
    assert {p.name for p in models} >= {"gpt.py", "gpt3.py", "bert.py"}
    for path in models:
        found = {n for n in imported_names(path) if any(n == api or n.startswith(api + ".") for api in PARALLEL_APIS)}
        assert not found, f"models/{path.name} imports {sorted(found)}: parallelism belongs in strategies/"
        assert "torch.distributed" not in path.read_text(), f"models/{path.name} uses torch.distributed"


def test_sample_reads_checkpoints_without_evaluate(pkg):
    names = imported_names(package_dir(pkg) / "sample.py")
    assert ".trained_model" in names
    assert not any(n == ".evaluate" or n.startswith(".evaluate.") for n in names), names


def test_checkpoint_readers_live_with_their_strategies(pkg):
    """trained_model only dispatches: each strategy module reads the format it writes."""
    for name in ("ddp", "deepspeed", "pipeline"):
        assert callable(pkg.module(f"strategies.{name}").read_checkpoint), name
    assert pkg.trained_model.load_trained_model is pkg.evaluate.load_trained_model
