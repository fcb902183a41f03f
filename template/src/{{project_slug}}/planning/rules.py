"""Rules that relate settings to each other, written once and used by `check`, train start
and the template's post-generation task.

Each rule returns Problems: one-line messages that name the field, the value, why it is wrong and
what to do, which also carry, as data, the config keys they concern and the key whose change is the
fix. Whoever relates a problem to a setting (the template's hooks blame a copier answer) reads
those, never the wording. No torch here: the rules must run where only copier and PyYAML are installed.
"""

from __future__ import annotations

import dataclasses
import math

from ..models.family import families, family, model_shape
from ..settings import optional_parts
from ..settings.batch import data_parallel_split
from ..settings.bounds import bound_problems
from ..settings.config import Config, ConfigError, ModelConfig, OptimConfig, Problem, changed
from ..settings.gpus import find_answer
from ..settings.precision import bf16_refusal, fp8_problem
from ..strategies import memory as strategy

__all__ = [
    "Problem",
    "model_shape",
    "check_config",
    "config_warnings",
    "family_problems",
    "family_settings",
    "parallel_problems",
    "precision_problems",
    "require_valid",
]


def check_config(cfg: Config, world_size: int | None = None) -> list[Problem]:
    """All problems of a config for a world size (default: nodes x gpus_per_node)."""
    problems: list[Problem] = []
    world = world_size or cfg.cluster.nodes * cfg.cluster.gpus_per_node
    if cfg.run.strategy not in strategy.strategy_plans():  # a config built in code; a file's is refused on load
        absent = optional_parts.without_choice("run.strategy", cfg.run.strategy)
        problems.append(
            Problem(str(absent or f"run.strategy={cfg.run.strategy} is not a strategy here"), "run.strategy")
        )
    # Each setting's own range (bounds.py); the rules below relate settings to each other.
    # (model.n_kv_head's own rule below says more: which head count it must divide.)
    problems += [Problem(message, key) for key, message in bound_problems(cfg) if key != "model.n_kv_head"]
    length = cfg.schedule.length_problem()
    if length:
        problems.append(Problem(length, "schedule.epochs", "schedule.max_steps"))
    # With schedule.epochs, max_steps is known once the data is prepared (data/epochs.py checks the warmup).
    if cfg.schedule.max_steps is not None and cfg.schedule.warmup_steps > cfg.schedule.max_steps:
        problems.append(
            Problem(
                f"schedule.warmup_steps={cfg.schedule.warmup_steps} exceeds schedule.max_steps={cfg.schedule.max_steps}; "
                "lower the warmup",
                "schedule.warmup_steps",
                "schedule.max_steps",
            )
        )
    try:
        shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch, cfg.model)
    except ConfigError as exc:  # an unknown family (exc.key model.arch), or a size it does not have
        return problems + [Problem(str(exc), exc.key or "model.size", "model.arch")]
    problems += parallel_problems(cfg, shape, world)
    problems += precision_problems(cfg)
    own = family_problems(cfg, shape)
    problems += own
    said = {p.fix_key for p in own}  # the family's own rules name some settings it does not read
    problems += [p for p in unread_setting_problems(cfg)[0] if p.fix_key not in said]
    problems += learning_rate_problems(cfg, shape)[0]
    if cfg.eval.tasks_every_steps and strategy.uses_pipeline_engine(cfg):
        problems.append(
            Problem(
                f"eval.tasks_every_steps={cfg.eval.tasks_every_steps}: the pipeline engine holds the model in "
                "stages over the ranks, so tasks are scored after training; set it to 0 and run "
                "`eval --tasks core` on a checkpoint (it reads any layout)",
                "eval.tasks_every_steps",
                "parallel.tensor",
                "parallel.pipeline",
            )
        )
    if cfg.eval.tasks_every_steps and not family(cfg.model.arch).causal:
        problems.append(
            Problem(
                f"eval.tasks_every_steps={cfg.eval.tasks_every_steps}: the task bundle scores continuations of a "
                f"causal model and model.arch={cfg.model.arch} is masked; set it to 0 (validation reports its "
                "masked-token loss and perplexity)",
                "eval.tasks_every_steps",
                "model.arch",
            )
        )
    problems += divergence_guard_problems(cfg)
    counts = (
        cfg.batch.micro_batch_size,
        cfg.batch.global_batch_size,
        world,
        cfg.parallel.tensor,
        cfg.parallel.pipeline,
    )
    if min(counts) >= 1 and (cfg.batch.grad_accum_steps or 1) >= 1:
        try:
            data_parallel_split(cfg, world)
        except ConfigError as exc:
            origin = "" if world_size else f" = {cfg.cluster.nodes} nodes x {cfg.cluster.gpus_per_node} GPUs per node"
            split = cfg.parallel.tensor * cfg.parallel.pipeline > 1
            layout = (
                f", data-parallel {cfg.data_parallel_size(world)} = {world} / (tensor {cfg.parallel.tensor} x "
                f"pipeline {cfg.parallel.pipeline})"
                if split
                else ""
            )
            # the data-parallel size comes from the cluster shape (and the layout, when it splits the model)
            shape_keys = ("cluster.nodes", "cluster.gpus_per_node") + (
                ("parallel.tensor", "parallel.pipeline") if split else ()
            )
            problems.append(
                Problem(
                    f"{exc} (for {world} processes{origin}{layout})",
                    exc.key,
                    "batch.global_batch_size",
                    "batch.micro_batch_size",
                    *shape_keys,
                )
            )
    return problems


def divergence_guard_problems(cfg: Config) -> list[Problem]:
    """The loss-spike test of the divergence guard (training/divergence.py): a factor of 1 or less would
    leave out every step whose loss is at or above its running mean. What a strategy refuses of it
    (one that applies its update before a verdict) is its own setting_problems."""
    factor = cfg.optim.loss_spike_factor
    if not factor or not math.isfinite(factor):
        return []
    if factor <= 1:
        return [
            Problem(
                f"optim.loss_spike_factor={factor:g} would leave out every step whose loss is above "
                f"{factor:g} x its running mean; use 0 (off) or a factor above 1 (e.g. 3)",
                "optim.loss_spike_factor",
            )
        ]
    return []


def family_problems(cfg: Config, shape: dict) -> list[Problem]:
    """What model.arch's family refuses in a config: what its descriptor's flags imply (the settings
    it reads, its sequence lengths, the heads its shape splits into), then its own rules (Family.problems)."""
    fam, m, found = family(cfg.model.arch), cfg.model, []
    name = fam.name
    if cfg.optim.optimizer == "muon" and not fam.muon:
        found.append(Problem(f"optim.optimizer=muon needs a model that names its matrices (model.arch=gpt), not "
                             f"model.arch={name}; use optim.optimizer=adamw", "optim.optimizer", "model.arch"))  # fmt: skip
    elif cfg.optim.optimizer == "muon" and not strategy.strategy_plan(cfg).runs_muon:
        runners = " or ".join(p.name for p in strategy.strategy_plans().values() if p.runs_muon)
        found.append(Problem(f"optim.optimizer=muon runs under run.strategy={runners}: run.strategy={cfg.run.strategy} steps "
                             "flat shards of the parameters and Muon needs each matrix whole; use "
                             f"optim.optimizer=adamw with run.strategy={cfg.run.strategy}, or run.strategy=ddp",
                             "optim.optimizer", "run.strategy"))  # fmt: skip
    if not fam.grouped_query and m.n_kv_head is not None:
        found.append(Problem(f"model.n_kv_head={m.n_kv_head} does not apply to model.arch={name}; set it to null",
                             "model.n_kv_head", "model.arch"))  # fmt: skip
    if not fam.attention_dropout and m.attention_dropout:
        found.append(Problem(f"model.attention_dropout={m.attention_dropout} does not apply to model.arch={name} "
                             "(model.dropout is its embedding and residual dropout); set it to null",
                             "model.attention_dropout", "model.arch"))  # fmt: skip
    if not fam.pretrained and m.pretrained:
        found.append(Problem(f"model.pretrained={m.pretrained!r}: model.arch={name} starts from scratch; "
                             'set it to ""', "model.pretrained", "model.arch"))  # fmt: skip
    if m.sequence_len < fam.min_sequence_len:
        found.append(Problem(f"model.sequence_len={m.sequence_len} is too short for model.arch={name}; use at "
                             f"least {fam.min_sequence_len} (e.g. 128)", "model.sequence_len", "model.arch"))  # fmt: skip
    if fam.max_sequence_len and m.sequence_len > fam.max_sequence_len:
        found.append(Problem(f"model.sequence_len={m.sequence_len} exceeds {name}'s {fam.max_sequence_len} "
                             f"position embeddings; use at most {fam.max_sequence_len}",
                             "model.sequence_len", "model.arch"))  # fmt: skip
    if shape["n_kv_head"] < 1 or shape["n_head"] % shape["n_kv_head"]:
        found.append(Problem(f"model.n_kv_head={shape['n_kv_head']} must divide the {shape['n_head']} query heads "
                             f"of model.size={m.size}; use a divisor of {shape['n_head']} or null",
                             "model.n_kv_head", "model.size"))  # fmt: skip
    if shape["n_embd"] % shape["n_head"] or (fam.rotary and shape["n_embd"] // shape["n_head"] % 2):
        even = " of even size (rotary embeddings pair dimensions)" if fam.rotary else ""
        found.append(Problem(f"model.size={m.size} needs a width divisible into heads{even}; choose another size",
                             "model.size"))  # fmt: skip
    return found + fam.problems(cfg, shape)


def config_warnings(cfg: Config) -> list[str]:
    """What `check` says without refusing: a setting the family does not read, written at its default;
    a learning rate of 0 among others (its parameters stay as they are, which may be meant)."""
    try:
        shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch, cfg.model)
    except ConfigError:  # check_config reports it
        return []
    return unread_setting_problems(cfg)[1] + learning_rate_problems(cfg, shape)[1]


# model.* settings every family reads; the rest are a family's own (family_settings).
COMMON_MODEL_SETTINGS = ("arch", "size", "sequence_len", "dropout", "activation_checkpointing")


def family_settings(arch: str) -> set[str]:
    """The model.* keys family `arch` reads: the common ones, those its descriptor writes into a new
    project's config/train.yaml, and those its flags say apply (grouped-query heads, attention
    dropout, local weights)."""
    fam = family(arch)
    answers = {
        "model_size": fam.default_size or next(iter(fam.sizes), ""),
        "strategy": fam.default_strategy,
        "gpt_recipe": fam.recipes[0] if fam.recipes else "",
        "pretrained_dir": "",
    }
    written = {key for key, _, _ in fam.config_settings("model", answers) if key}
    flags = {"n_kv_head": fam.grouped_query, "attention_dropout": fam.attention_dropout, "pretrained": fam.pretrained}
    return {*COMMON_MODEL_SETTINGS, *written, *(key for key, applies in flags.items() if applies)}


def _as_written(value) -> str:
    """A setting's value as train.yaml writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def unread_setting_problems(cfg: Config) -> tuple[list[Problem], list[str]]:
    """(refusals, warnings) for model.* settings model.arch does not read (one family's switch on
    another): set to anything but its default it would be ignored, which is refused; written at its
    default it changes nothing, which is one warning for them all."""
    arch, defaults = cfg.model.arch, ModelConfig()
    reads = family_settings(arch)
    refused, ignored = [], []
    for setting in dataclasses.fields(ModelConfig):
        if setting.name in reads:
            continue
        key, value, default = f"model.{setting.name}", getattr(cfg.model, setting.name), getattr(defaults, setting.name)
        if value != default:
            refused.append(
                Problem(
                    f"{key}={_as_written(value)} does not apply to model.arch={arch}: {arch} does not read it, so the "
                    f"run would train without it; remove it (or set it to {_as_written(default)})",
                    key,
                    "model.arch",
                )
            )
        elif key in cfg.given_keys:
            ignored.append(f"{key}={_as_written(value)}")
    if not ignored:
        return refused, []
    them = "them" if len(ignored) > 1 else "it"
    return refused, [f"{', '.join(ignored)}: model.arch={arch} does not read {them} (ignored); remove {them}"]


# The learning rates optim holds: AdamW reads lr; Muon's recipe the *_lr its family's roles derive theirs from.
RATE_KEYS = tuple(f"optim.{f.name}" for f in dataclasses.fields(OptimConfig) if f.name.endswith("lr"))


def learning_rates(cfg: Config, shape: dict) -> dict[str, float]:
    """{optim key: peak rate} of the learning rates this run reads: optim.lr under AdamW; under Muon
    each optim.*_lr that some parameter role's rate follows (found by changing it: no role names here)."""
    if cfg.optim.optimizer != "muon":
        return {"optim.lr": cfg.optim.lr}
    fam = family(cfg.model.arch)
    if not fam.muon or bound_problems(cfg):  # refused by the family's rules, or values out of range
        return {}

    def rates(c: Config) -> dict[str, float]:
        return {role: group["lr"] for role, group in fam.optimizer_groups(c, shape).items()}

    given = rates(cfg)
    read = {}
    for key in RATE_KEYS:
        value = getattr(cfg.optim, key.partition(".")[2])
        if rates(changed(cfg, **{key: value + 1.0})) != given:
            read[key] = value
    return read


def learning_rate_problems(cfg: Config, shape: dict) -> tuple[list[Problem], list[str]]:
    """(refusals, warnings): every learning rate the run reads at 0 trains nothing, refused; some at 0
    among others freeze their parameters, which may be meant (warned)."""
    rates = learning_rates(cfg, shape)
    zeroed = [key for key, value in rates.items() if value == 0]
    if not zeroed:
        return [], []
    defaults = OptimConfig()
    named = ", ".join(f"{key}=0" for key in zeroed[:-1]) + (" and " if len(zeroed) > 1 else "") + f"{zeroed[-1]}=0"
    if len(zeroed) == len(rates):
        example = ", ".join(f"{key}={getattr(defaults, key.partition('.')[2]):g}" for key in zeroed)
        every = "every learning rate the run reads" if len(zeroed) > 1 else "the run's only learning rate"
        return [
            Problem(
                f"{named}: {every} is 0 (optim.optimizer={cfg.optim.optimizer}), so nothing would train; "
                f"set {'them' if len(zeroed) > 1 else 'it'} above 0 (e.g. {example})",
                zeroed[0],
                *zeroed,
                "optim.optimizer",
            )
        ], []
    steer = "they steer" if len(zeroed) > 1 else "it steers"
    return [], [
        f"{named}: the parameters {steer} stay as they are while the others train; set a rate above 0 "
        "unless they are meant to stay frozen"
    ]


def parallel_problems(cfg: Config, shape: dict, world: int) -> list[Problem]:
    """Tensor and pipeline degrees against the world size, the model's shape and the strategy."""
    tp, pp, arch = cfg.parallel.tensor, cfg.parallel.pipeline, cfg.model.arch
    degrees = ("parallel.tensor", "parallel.pipeline")
    if min(tp, pp) < 1 or (tp, pp) == (1, 1):  # a degree below 1 is reported by bounds.py
        return []
    split = "parallel.tensor" if tp > 1 else "parallel.pipeline"  # a degree above 1, which the fix lowers
    if not family(arch).layouts:
        layouts = [f.name for f in families().values() if f.layouts]
        return [
            Problem(
                f"parallel.tensor={tp}, parallel.pipeline={pp}: tensor and pipeline parallelism are built for "
                f"model.arch={' or '.join(layouts)} only (this is {arch}); set both to 1 and scale {arch} by data parallelism",
                split,
                *degrees,
                "model.arch",
            )
        ]
    problems = []
    if tp > cfg.cluster.gpus_per_node:
        problems.append(
            Problem(
                f"parallel.tensor={tp} exceeds cluster.gpus_per_node={cfg.cluster.gpus_per_node}: "
                "tensor parallelism all-reduces in every layer and must stay inside one node's NVLink; "
                f"use at most {cfg.cluster.gpus_per_node}",
                "parallel.tensor",
                "cluster.gpus_per_node",
            )
        )
    if world % (tp * pp):
        problems.append(
            Problem(
                f"parallel.tensor {tp} x parallel.pipeline {pp} = {tp * pp} does not divide the "
                f"{world} processes; choose degrees whose product divides {world}",
                "parallel.pipeline" if pp > 1 else "parallel.tensor",
                *degrees,
                "cluster.nodes",
                "cluster.gpus_per_node",
            )
        )
    if shape["n_head"] % tp:
        problems.append(
            Problem(
                f"parallel.tensor={tp} does not divide the {shape['n_head']} attention heads of "
                f"model.size={cfg.model.size}; use a divisor of {shape['n_head']}",
                "parallel.tensor",
                "model.size",
            )
        )
    if shape["n_layer"] % pp:
        problems.append(
            Problem(
                f"parallel.pipeline={pp} does not divide the {shape['n_layer']} layers of "
                f"model.size={cfg.model.size}; use a divisor of {shape['n_layer']}",
                "parallel.pipeline",
                "model.size",
            )
        )
    problems += strategy.layout_problems(cfg)
    return problems


def precision_problems(cfg: Config, precision: str | None = None) -> list[Problem]:
    """What refuses training in `precision` on cluster.gpu_type (the ranks judge their own device
    too). precision: by default run.dtype as written (check_config: 'auto' depends on the device);
    plan and the copier task pass precision.on_gpu_type(cfg), 'auto' resolved for cluster.gpu_type."""
    precision, problems = precision or cfg.run.dtype, []
    found = find_answer(cfg.cluster.gpu_type)
    name = f"{found[0].device_name if found else 'GPU'} of cluster.gpu_type={cfg.cluster.gpu_type}"
    if precision == "bf16" and found is not None and not found[0].has_bf16:
        problems.append(Problem(bf16_refusal(name), "run.dtype", "cluster.gpu_type"))
    fp8 = fp8_problem(
        cfg.run.fp8,
        precision if precision != "auto" else "bf16",
        on_gpu=True,
        gpu_has_fp8=found is None or found[0].has_fp8,
        gpu_name=name,
        compiled=None,
    )
    if fp8:
        problems.append(Problem(fp8, "run.fp8", "run.dtype", "cluster.gpu_type"))
    return problems + strategy.strategy_problems(cfg, precision, name, fp8_allowed=not fp8)


def require_valid(cfg: Config, world_size: int | None = None) -> None:
    problems = check_config(cfg, world_size)
    if problems:
        raise ConfigError("\n".join(problems))
