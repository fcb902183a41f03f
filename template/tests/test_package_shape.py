"""The package's shape, read from its source (nothing is imported): the folders are the layers, every
import arrow points down them, with no cycles; settings and planning import no torch, models no
parallel API; no module is a fragment; the README names every module.

    python -m pytest -q tests/test_package_shape.py

A new module goes into the folder of its concern; the test names what breaks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE_DIR = next(p.parent for p in (Path(__file__).resolve().parents[1] / "src").glob("*/cli.py"))

# The folders, lowest first. A module may import its own folder and the folders of lower tiers; folders
# of one tier stay independent of each other. The modules at the top level are the entry, above all.
TIERS = [
    ("settings",),  # plain Python: config, bounds, GPUs, precision, topology
    ("models",),  # a family each: its descriptor (torch-free) beside its plain layers
    ("data",),  # prepare-data and the token stream
    ("runtime",),  # process group, unrecoverable failures, faults, how a process ends
    ("checkpoints",),  # writing, verifying, finding and resizing checkpoints
    (
        "strategies",
    ),  # DDP; DeepSpeed ZeRO, pipeline and tensor parallel (deepspeed/); memory.py: what each keeps and allows
    ("planning",),  # every rule run together, memory fit and time: torch-free
    ("evaluation",),  # a trained model loaded, eval, sample
    ("tracking",),  # experiment trackers (TensorBoard, MLflow, W&B) and their credentials
    ("training",),  # the loop and its parts
    ("cluster",),  # node launcher, torchrun, rendezvous, supervision
    (
        "launch",
        "diagnostics",
        "image",
    ),  # a folder per platform (TI-ONE's Ray Train too); doctor and debug-dump; the image
]
# An optional part is one folder (strategies/deepspeed/), so its launcher lives there, at launch's tier.
CONCERN_OF = {"strategies.deepspeed.launcher": "launch"}
ENTRY = {"__init__", "__main__", "cli"}  # the package's top level: the entry...
MAX_OTHER_TOP_LEVEL = 5  # ...and at most this many other modules
TORCH_FREE = ("settings", "planning")
PARALLEL_APIS = ("deepspeed", "torch.distributed", "torch.nn.parallel", "torch.distributed.fsdp")


def modules() -> dict[str, Path]:
    """Dotted name inside the package ("launch.slurm", "models") -> file."""
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
        if "tests" in parts:
            continue
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
                inner.add(target if target in known else ".".join(base) or "__init__")
    inner.discard(name)
    return inner, outer


def folder_of(name: str) -> str | None:
    """The concern folder a module lives in; None at the package's top level."""
    return name.split(".")[0] if "." in name or name in {f for tier in TIERS for f in tier} else None


def tier_of(name: str) -> int:
    folder = CONCERN_OF.get(name) or folder_of(name)
    if folder is None:
        return len(TIERS)  # the entry
    for index, folders in enumerate(TIERS):
        if folder in folders:
            return index
    raise AssertionError(
        f"{name} is in a folder tests/test_package_shape.py does not know: {folder}/ (add it to TIERS)"
    )


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known)[0] for name, path in known.items()}


def test_every_import_points_down_the_folders():
    wrong = [
        f"{a} imports {b}"
        for a, targets in graph().items()
        for b in sorted(targets)
        if tier_of(b) > tier_of(a) or (tier_of(b) == tier_of(a) and folder_of(a) != folder_of(b))
    ]
    assert not wrong, "imports upward or across independent folders:\n" + "\n".join(wrong)


def test_the_top_level_is_the_entry():
    top = sorted(name for name in modules() if folder_of(name) is None)
    others = [name for name in top if name not in ENTRY]
    assert len(others) <= MAX_OTHER_TOP_LEVEL, f"modules at the package's top level beyond the entry: {others}"


def top_level_imports(path: Path) -> set[str]:
    """Outside modules a module imports when it is imported (not those inside its functions)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        for inner in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(inner, ast.Import):
                found |= {alias.name for alias in inner.names}
            elif isinstance(inner, ast.ImportFrom) and inner.level == 0:
                found.add(inner.module)
    return found


def loaded_on_import(name: str, known: dict[str, Path]) -> set[str]:
    """The package's modules importing `name` loads (its top-level imports, their packages, and so on)."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in known:
            continue
        seen.add(current)
        parts = current.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages on the way
        here = parts if known[current].name == "__init__.py" else parts[:-1]
        for node in ast.parse(known[current].read_text()).body:
            for inner in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
                if isinstance(inner, ast.ImportFrom) and inner.level > 0:
                    base = here[: len(here) - inner.level + 1] + (inner.module.split(".") if inner.module else [])
                    todo += [".".join([*base, a.name]) for a in inner.names] + [".".join(base)]
    return seen


def test_settings_and_planning_import_no_torch():
    """check, plan and copier's hooks run where torch is not installed: nothing settings/ or planning/
    import loads torch, in their own functions or through another module (the families' descriptors and
    strategies/memory.py included)."""
    known = modules()
    heavy = ("torch", "deepspeed", "transformers")
    found = [
        f"{name} imports {module}"
        for name, path in known.items()
        if folder_of(name) in TORCH_FREE
        for module in sorted(imports(name, path, known)[1])
        if module.split(".")[0] in heavy
    ]
    found += [
        f"{name} loads {other}, which imports {module}"
        for name in known
        if folder_of(name) in TORCH_FREE
        for other in sorted(loaded_on_import(name, known))
        for module in sorted(top_level_imports(known[other]))
        if module.split(".")[0] in heavy
    ]
    assert not found, "settings/ and planning/ run where torch is not installed:\n" + "\n".join(sorted(set(found)))


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


def test_sample_loads_a_model_without_evaluate():
    """Loading a trained model has one home (trained_model.py); sample needs nothing of eval."""
    known = modules()
    sample = imports("evaluation.sample", known["evaluation.sample"], known)[0]
    assert "evaluation.trained_model" in sample and "evaluation.evaluate" not in sample


def test_each_strategy_reads_the_checkpoints_it_writes(pkg):
    """trained_model only picks the reader; the format's knowledge stays with the strategy that saves it."""
    with_deepspeed = pkg.module("settings.optional_parts").has_deepspeed()
    for name in (
        "ddp",
        "fsdp.sharded_checkpoint",
        *(("deepspeed.engine", "deepspeed.pipeline") if with_deepspeed else ()),
    ):
        assert callable(pkg.module(f"strategies.{name}").read_checkpoint), name


def test_readme_lists_every_module():
    """The generated README's file list names every module of the package, and only modules that exist."""
    readme = (PACKAGE_DIR.parents[1] / "README.md").read_text()
    files = readme[readme.index("\n## Files") :]
    files = files[files.index(f"src/{PACKAGE_DIR.name}/") : files.index("\ntests/")]
    named = set(re.findall(r"([\w/]+)\.py\b", files))
    on_disk = {path.relative_to(PACKAGE_DIR).with_suffix("").as_posix() for path in PACKAGE_DIR.rglob("*.py")
               if "tests" not in path.relative_to(PACKAGE_DIR).parts}  # fmt: skip
    on_disk = {name for name in on_disk if not name.endswith(("__init__", "__main__"))}
    missing = sorted(name for name in on_disk if name not in named and name.rpartition("/")[2] not in named)
    assert not missing, f"README.md's Files section does not name: {missing}"
    stale = sorted(name for name in named if name not in on_disk and not any(m.endswith("/" + name) for m in on_disk))
    assert not stale, f"README.md's Files section names modules that do not exist: {stale}"
