"""Whether a config fits its GPUs, and the smallest change that makes it fit: single changes on the
same GPUs first (smaller micro batch, activation checkpointing, a higher sharding stage, optimizer
offload, more pipeline stages, on the strategies the project holds), then those changes piled up, then more nodes. A change the rules
refuse is never suggested. No torch; the figures are estimates.py's.

    from .fit import fit_problem, suggest
    fit_problem(cfg)   # None, or one line: "does not fit: <figures>; smallest change: <keys to set>"
    suggest(cfg)       # the change alone, e.g. "4 pipeline stages (parallel.pipeline=4; copier answer ...)"

check_project (copier's post-generation task) and hooks/answers.py (copier's validators) call
`fit_problem`; `plan` prints `suggest` under its verdict.
"""

from __future__ import annotations

from ..models.family import family
from ..settings.batch import resolve_grad_accum
from ..settings.config import Config, ConfigError, changed
from ..strategies.memory import at_stage, for_pipeline_engine, strategy_plan
from ..strategies.memory import describe as describe_strategy
from .estimates import GIB, layout_problems, memory
from .rules import Problem


def allowed(cfg: Config | None) -> bool:
    """The rules accept the layout and the global batch splits into micro batches x data ranks (None:
    a sharding no strategy of the project has)."""
    if cfg is None or layout_problems(cfg):
        return False
    try:
        resolve_grad_accum(cfg, cfg.data_parallel_size(cfg.cluster.nodes * cfg.cluster.gpus_per_node))
    except ConfigError:
        return False
    return True


def fits(cfg: Config | None) -> bool:
    return allowed(cfg) and memory(cfg)["fits"]


def same_hardware(cfg: Config):
    """Single changes on the same GPUs, in the order plan tries them: smaller micro batch,
    activation checkpointing, a higher sharding stage, optimizer offload, more pipeline stages."""
    micro = cfg.batch.micro_batch_size // 2
    while micro >= 1:
        yield changed(cfg, **{"batch.micro_batch_size": micro, "batch.grad_accum_steps": None})
        micro //= 2
    if not cfg.model.activation_checkpointing:
        yield changed(cfg, **{"model.activation_checkpointing": True})
    now = cfg.sharding()
    for higher in range(now.stage + 1, 4):
        yield at_stage(cfg, higher)
    if not now.offload_optimizer:
        yield at_stage(cfg, max(now.stage, 1), offload_optimizer=True)
    yield from more_stages(cfg)


def more_stages(cfg: Config):
    """A family with parallel layouts: the next pipeline degrees that divide the layers (and the
    world), on the strategy that runs layouts."""
    fam = family(cfg.model.arch)
    moved = for_pipeline_engine(cfg) if fam.layouts else None
    if moved is None:
        return
    layers = fam.shape(cfg.model.size)["n_layer"]
    for pp in range(cfg.parallel.pipeline + 1, layers + 1):
        if layers % pp == 0:
            yield changed(moved, **{"parallel.pipeline": pp})


def piles(cfg: Config):
    """The same changes added one on top of the other (a change the rules refuse is left out)."""
    micros = [
        m
        for m in range(1, cfg.batch.micro_batch_size + 1)
        if allowed(changed(cfg, **{"batch.micro_batch_size": m, "batch.grad_accum_steps": None}))
    ]
    if micros:
        cfg = changed(cfg, **{"batch.micro_batch_size": micros[0], "batch.grad_accum_steps": None})
        yield cfg
    cfg = changed(cfg, **{"model.activation_checkpointing": True})
    yield cfg
    for stage in range(cfg.sharding().stage + 1, 4):
        if allowed(at_stage(cfg, stage)):
            cfg = at_stage(cfg, stage)
            yield cfg
    stage = max(cfg.sharding().stage, 1)
    if allowed(at_stage(cfg, stage, True)):
        cfg = at_stage(cfg, stage, True)
        yield cfg
    if stage == 3:
        cfg = at_stage(cfg, 3, True, True)
        yield cfg
    yield from more_stages(cfg)


def more_nodes(cfg: Config):
    """2x, 4x, ... the nodes at the highest sharding stage the layout allows (at least the current)."""
    nodes = cfg.cluster.nodes * 2
    now = cfg.sharding()
    while nodes <= 128:
        wider = changed(cfg, **{"cluster.nodes": nodes})
        stages = [s for s in range(now.stage, 4) if allowed(at_stage(wider, s))]
        top = stages[-1] if stages else None
        yield (
            at_stage(wider, top, now.offload_optimizer and top > 0, now.offload_params and top == 3)
            if stages
            else wider
        )
        nodes *= 2


def describe(old: Config, new: Config) -> str:
    """The changes from old to new as config keys to set (and copier answers where there is one)."""
    parts = []
    if new.batch.micro_batch_size != old.batch.micro_batch_size:
        accum = resolve_grad_accum(new, new.data_parallel_size(new.cluster.nodes * new.cluster.gpus_per_node))
        parts.append(
            f"batch.micro_batch_size={new.batch.micro_batch_size} (grad accumulation {accum}, global batch unchanged)"
        )
    if new.model.activation_checkpointing and not old.model.activation_checkpointing:
        parts.append("activation checkpointing (model.activation_checkpointing=true)")
    if (new.sharding(), new.run.strategy) != (old.sharding(), old.run.strategy):
        plan = strategy_plan(new)
        keys, answers = plan.settings(old, new)
        parts.append(
            f"{plan.describe_sharding(new.sharding())} ({' '.join(keys)}; copier answers {', '.join(answers)})"
        )
    if new.parallel.pipeline != old.parallel.pipeline:
        p = new.parallel.pipeline
        parts.append(f"{p} pipeline stages (parallel.pipeline={p}; copier answer pipeline_parallel={p})")
    if new.cluster.nodes != old.cluster.nodes:
        n = new.cluster.nodes
        parts.append(f"{n} nodes (cluster.nodes={n}; copier answer nodes={n})")
    return " + ".join(parts)


def suggest(cfg: Config) -> str | None:
    """The first single change on the same hardware that fits; then those changes piled up in the
    same order; then more nodes, alone and on top of the whole pile. None if nothing fits."""
    for cand in same_hardware(cfg):
        if fits(cand):
            return describe(cfg, cand)
    piled = list(piles(cfg))
    for cand in piled:
        if fits(cand):
            return "together: " + describe(cfg, cand)
    full = [c for c in piled if c.parallel.pipeline == cfg.parallel.pipeline][-1:]
    for base in (cfg, *full):
        for cand in more_nodes(base):
            if fits(cand):
                return ("" if base is cfg else "together: ") + describe(cfg, cand)
    return None


# --- the one line for copier and check_project ---------------------------------------------------


def fit_problem(cfg: Config) -> Problem | None:
    """None when the config fits its GPUs; else one line: the figures and the smallest change.
    A misfit is a problem of cluster.gpu_type: the GPU is chosen after everything that shapes the memory."""
    m = memory(cfg)
    if m["fits"]:
        return None
    if m["problems"]:  # the first refusal's fix comes first
        return Problem("refused: " + "; ".join(m["problems"]), *[k for p in m["problems"] for k in p.keys])
    g = lambda b: f"{b / GIB:.1f}"  # noqa: E731
    act = m["activations_checkpointed" if cfg.model.activation_checkpointing else "activations"]
    where = f", pipeline stage {m['pipeline_stage']} of {m['pipeline']}" if m["pipeline"] > 1 else ""
    reason = (
        f"{cfg.model.arch} {cfg.model.size} on {cfg.cluster.nodes} x {cfg.cluster.gpus_per_node} "
        f"{cfg.cluster.gpu_type} ({describe_strategy(cfg)}, tensor {m['tensor']} x pipeline {m['pipeline']} x data "
        f"{m['data_parallel']}, micro batch {cfg.batch.micro_batch_size}{where}) needs {g(m['total'])} GiB "
        f"per GPU (weights {g(m['weights'])} + grads {g(m['grads'])} + optimizer {g(m['optimizer'])} + "
        f"activations {g(act)}) > {g(m['usable'])} GiB usable of {m['gpu'] / GIB:.0f} GiB"
    )
    change = suggest(cfg) or "none found (a smaller model or larger GPUs)"
    return Problem(
        f"does not fit: {reason}; smallest change: {change}",
        "cluster.gpu_type",
        "model.size",
        "batch.micro_batch_size",
        "cluster.nodes",
        "cluster.gpus_per_node",
    )
