"""A run is resolved once: at its start training/train.py builds the Run (runtime/run_context.py
resolve_run: family, precision, device, parallel sizes, batch arithmetic) and everything below reads
it. Read from the source (nothing imported but the package for one small Run):

    - no module calls resolve_precision or Config.data_parallel_size but resolve_run's own, and
      planning's and the batch arithmetic's, which ask them of other configs and world sizes (plan,
      check, fit, scaling; settings/batch.py);
    - on the run's path (runtime, checkpoints, strategies, training) nobody looks the family up again
      (family(<cfg>.model.arch)), except where the config is not the run's (listed below).

    python -m pytest -q tests/test_run_context.py
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = next(p.parent for p in (Path(__file__).resolve().parents[1] / "src").glob("*/cli.py"))
CONTEXT_MODULE = "runtime/run_context.py"  # resolve_run: the one place a run is resolved
BATCH_MODULE = "settings/batch.py"  # the arithmetic resolve_run and planning share
RESOLVERS = ("resolve_precision", "data_parallel_size")
RUN_PATH = ("runtime", "checkpoints", "strategies", "training")
# Functions on the run's path that look a family up for a config that is not the running one.
FAMILY_ELSEWHERE = {
    ("strategies/memory.py", "uses_pipeline_engine"): "plan and check ask it of any config; a run passes its family",
    ("strategies/deepspeed/pipeline.py", "read_checkpoint"): "a saved checkpoint's config, read by eval and sample",
    ("strategies/fsdp/plan.py", "gathered_bytes"): "plan and check ask it of any config",
}


def sources() -> dict[str, ast.Module]:
    """Path inside the package ("strategies/ddp.py") -> its syntax tree; tests left out."""
    return {
        path.relative_to(PACKAGE_DIR).as_posix(): ast.parse(path.read_text())
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if "tests" not in path.relative_to(PACKAGE_DIR).parts
    }


def calls_with_function(tree: ast.Module):
    """(call, name of the innermost enclosing function or None) for every call in the module."""

    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                yield child, function
            yield from walk(child, inner)

    yield from walk(tree, None)


def called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def reads_model_arch(node: ast.AST) -> bool:
    """`<anything>.model.arch`."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "arch"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "model"
    )


def test_precision_and_data_parallel_size_are_resolved_in_one_place():
    found = []
    for path, tree in sources().items():
        if path.startswith("planning/") or path in (CONTEXT_MODULE, BATCH_MODULE):
            continue
        for call, _ in calls_with_function(tree):
            if called_name(call) in RESOLVERS:
                found.append(f"{path}:{call.lineno} calls {called_name(call)}")
    assert not found, "resolved again outside resolve_run (read the Run instead): " + "; ".join(found)


def test_the_runs_path_reads_the_family_from_the_run():
    found = []
    for path, tree in sources().items():
        if path.split("/")[0] not in RUN_PATH or path == CONTEXT_MODULE:
            continue
        for call, function in calls_with_function(tree):
            looked_up = called_name(call) == "family" and call.args and reads_model_arch(call.args[0])
            if looked_up and (path, function) not in FAMILY_ELSEWHERE:
                found.append(f"{path}:{call.lineno} ({function})")
    assert not found, "family(<cfg>.model.arch) on the run's path (read run.family): " + "; ".join(found)


def test_only_resolve_run_builds_a_run():
    """Run(...) is constructed by resolve_run alone, so every Run holds the same resolution."""
    found = [
        f"{path}:{call.lineno}"
        for path, tree in sources().items()
        for call, function in calls_with_function(tree)
        if called_name(call) == "Run" and not (path == CONTEXT_MODULE and function == "resolve_run")
    ]
    assert not found, found


def test_a_tiny_cpu_run_resolves_to_fp32_and_the_data_parallel_share(pkg, cfg_with):
    import torch

    dist = pkg.distributed
    cfg = cfg_with(
        "model.arch=gpt",
        "run.dtype=auto",
        "batch.global_batch_size=32",
        "batch.micro_batch_size=2",
        "batch.grad_accum_steps=null",
    )
    info = dist.DistInfo(rank=3, local_rank=1, world_size=8, device=torch.device("cpu"))
    run = pkg.module("training.train").start(cfg, info)  # as `train` resolves it
    assert run.precision == "fp32" and run.family.name == "gpt" and not run.is_main
    assert run.data_parallel_size == 8 // (cfg.parallel.tensor * cfg.parallel.pipeline)
    assert run.global_batch_size == run.micro_batch_size * run.grad_accum * run.data_parallel_size == 32
    assert pkg.run_context.resolve_run(cfg, info).grad_accum is None  # eval and sample take no optimizer steps
    assert (run.strategy, run.sharding.stage, run.pipeline_engine) == ("ddp", 0, False)


@pytest.mark.part("gpt3", "deepspeed")
def test_the_run_holds_the_strategy_its_sharding_and_the_pipeline_engine(pkg, cfg_with):
    """Below the start nothing reads them from the config again: build_strategy picks by the Run."""
    import torch

    info = pkg.distributed.DistInfo(rank=0, local_rank=0, world_size=4, device=torch.device("cpu"))
    base = ["batch.global_batch_size=16", "batch.micro_batch_size=2", "batch.grad_accum_steps=null"]
    zero2 = pkg.run_context.resolve_run(
        cfg_with("model.arch=gpt", *base, "run.strategy=deepspeed", "deepspeed.zero_stage=2"), info, training=True
    )
    assert (zero2.strategy, zero2.sharding.stage, zero2.pipeline_engine, zero2.grad_accum) == ("deepspeed", 2, False, 2)
    # a stage written in the config of a DDP run is no stage of the run
    ddp = pkg.run_context.resolve_run(cfg_with("model.arch=gpt", *base, "deepspeed.zero_stage=3"), info)
    assert (ddp.strategy, ddp.sharding.stage) == ("ddp", 0)
    layout = ["run.strategy=deepspeed", "deepspeed.zero_stage=1", "parallel.pipeline=2"]
    piped = pkg.run_context.resolve_run(
        cfg_with("model.arch=gpt3", "model.size=tiny", *base, *layout), info, training=True
    )
    assert piped.pipeline_engine and piped.data_parallel_size == 2 and piped.grad_accum == 4
    # the same degrees on a family without layouts run no pipeline engine
    assert not pkg.run_context.resolve_run(cfg_with("model.arch=gpt", *base, *layout), info).pipeline_engine


def members(cls: ast.ClassDef) -> set[str]:
    """What a class defines: its methods and properties, its class attributes, what its methods assign to self."""
    found = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
    for node in ast.walk(cls):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    found.add(t.attr)
    return found


def test_every_strategy_keeps_the_contract():
    """strategies/base.py's Strategy is what the loop, evaluation and checkpoints may ask of a strategy;
    every strategy class has each of its members, itself or through the class it extends."""
    trees = sources()
    contract = next(n for n in ast.walk(trees["strategies/base.py"]) if isinstance(n, ast.ClassDef))
    wanted = members(contract) - {"__init__"}
    classes = {
        node.name: node
        for path, tree in trees.items()
        if path.startswith("strategies/") and path != "strategies/base.py"
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name.endswith("Strategy")
    }
    with_deepspeed = any(path.startswith("strategies/deepspeed/") for path in trees)
    expected = {"DDPStrategy", *(("DeepSpeedStrategy", "PipelineStrategy") if with_deepspeed else ())}
    assert expected <= set(classes), sorted(classes)

    def has(cls: ast.ClassDef) -> set[str]:
        inherited = [classes[b.id] for b in cls.bases if isinstance(b, ast.Name) and b.id in classes]
        return members(cls).union(*(has(parent) for parent in inherited))

    missing = {name: sorted(wanted - has(cls)) for name, cls in classes.items() if wanted - has(cls)}
    assert not missing, f"strategies missing members of base.Strategy: {missing}"
