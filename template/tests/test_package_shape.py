"""The package's shape, read from its source (nothing is imported): import arrows point down the
layers below, with no cycles; models/ use no parallel API; modules stay small; the README names them all.

    python -m pytest -q tests/test_package_shape.py

A new module goes into LAYERS at the lowest layer its imports allow; the test names what breaks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE_DIR = next(p.parent for p in (Path(__file__).resolve().parents[1] / "src").glob("*/cli.py"))

# Lowest first. A module may import its own layer and those below, never one above.
LAYERS = {
    # plain Python: configuration, the rules between settings, tables, platform variables, and what doctor and
    # debug-dump read (NCCL's log, the fabric settings, RDMA ports, the local ranks and their stacks)
    "settings": {
        "config",
        "bounds",
        "sizes",
        "rules",
        "gpus",
        "precision",
        "estimates",
        "fit",
        "scaling",
        "project",
        "env_files",
        "topology",
        "network",
        "nccl_env",
        "nccl_log",
        "nccl_verdict",
        "verdicts",
        "fabric",
        "rdma",
        "local_ranks",
        "rank_stacks",
        "faults",
        "preemption",
        "checkpoint_files",
        "run_lock",
        "unrecoverable",
        "demo_corpus",
        "progress",
        "staging",
    },
    "blocks": {
        "distributed",
        "metrics",
        "models",
        "data",
        "documents",
        "encode_parts",
        "encode_workers",
        "mlm_data",
        "training",
        "splits",
        "checkpoint",
    },  # torch building blocks
    "strategies": {"strategies"},  # how a model is spread over processes, and the formats they save
    "jobs": {"train", "evaluate", "sample", "trained_model", "prepare_data"},  # what runs in a process
    "commands": {  # what a user or a platform starts
        "check_project",
        "plan",
        "image",
        "image_plan",
        "doctor",
        "node_checks",
        "allreduce_bench",
        "debug_dump",
        "supervise",
        "torchrun",
        "rendezvous",
        "node",
        "launch",
        "ray_train",
    },
    "entry": {"cli", "__main__", "__init__"},
}
PARALLEL_APIS = ("deepspeed", "torch.distributed", "torch.nn.parallel", "torch.distributed.fsdp")
MAX_LINES = 400


def modules() -> dict[str, Path]:
    """Dotted name inside the package ("launch.slurm", "models") -> file."""
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(modules of the package, outside modules) that `name` imports, at the top or inside a function."""
    inner, outer = set(), set()
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            outer |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            outer.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] + (node.module.split(".") if node.module else [])
            for alias in node.names:
                target = ".".join([*base, alias.name])
                inner.add(target if target in known else ".".join(base))
    inner.discard("")
    inner.discard(name)
    return inner, outer


def layer_of(name: str) -> int:
    top = name.split(".")[0]
    for index, members in enumerate(LAYERS.values()):
        if top in members:
            return index
    raise AssertionError(
        f"module {name} is in no layer of tests/test_package_shape.py LAYERS: add it at the lowest "
        "layer its imports allow"
    )


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known)[0] for name, path in known.items()}


def test_every_module_has_a_layer_and_imports_none_above_it():
    names = list(LAYERS)
    upward = [
        f"{a} ({names[layer_of(a)]}) imports {b} ({names[layer_of(b)]})"
        for a, targets in graph().items()
        for b in sorted(targets)
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_import_cycles():
    edges = graph()
    cycles, done, path = [], set(), []

    def visit(node: str) -> None:
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt in path:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in done:
                visit(nxt)
        path.pop()
        done.add(node)

    for node in sorted(edges):
        if node not in done:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_models_use_no_parallel_api():
    known = modules()
    found = [
        f"{name} imports {module}"
        for name, path in known.items()
        if name.split(".")[0] == "models"
        for module in sorted(imports(name, path, known)[1])
        if module.startswith(PARALLEL_APIS)
    ]
    assert not found, "models/ must build plain layers (parallelism is applied in strategies/):\n" + "\n".join(found)


def test_modules_stay_small():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them where the seams are): {long}"


def test_sample_loads_a_model_without_evaluate():
    """Loading a trained model has one home (trained_model.py); sample needs nothing of eval."""
    known = modules()
    assert "trained_model" in imports("sample", known["sample"], known)[0]
    assert "evaluate" not in imports("sample", known["sample"], known)[0]


def test_each_strategy_reads_the_checkpoints_it_writes(pkg):
    """trained_model only picks the reader; the format's knowledge stays with the strategy that saves it."""
    for name in ("ddp", "deepspeed", "pipeline"):
        assert callable(pkg.module(f"strategies.{name}").read_checkpoint), name


def test_readme_lists_every_module():
    """The generated README's file list names every module of the package, and only modules that exist."""
    readme = (PACKAGE_DIR.parents[1] / "README.md").read_text()
    files = readme[readme.index("\n## Files") :]
    files = files[files.index(f"src/{PACKAGE_DIR.name}/") : files.index("\ntests/")]
    named = set(re.findall(r"([\w/]+)\.py\b", files))
    on_disk = {path.relative_to(PACKAGE_DIR).with_suffix("").as_posix() for path in PACKAGE_DIR.rglob("*.py")}
    on_disk = {name for name in on_disk if not name.endswith(("__init__", "__main__"))}
    missing = sorted(name for name in on_disk if name not in named and name.rpartition("/")[2] not in named)
    assert not missing, f"README.md's Files section does not name: {missing}"
    stale = sorted(name for name in named if name not in on_disk and not any(m.endswith("/" + name) for m in on_disk))
    assert not stale, f"README.md's Files section names modules that do not exist: {stale}"
