"""What the project knows of a model family, in one place, and where families are found (no torch).

Everything outside models/ asks a family's descriptor and never the family's name: its shapes by
size, its parameter, FLOP and activation formulas (the nn.Module and `plan` use the same ones), its
tokenizer and objective, what sample does with it, which parallel layouts it runs (and the layers a
pipeline stage is built from), what copier writes into a new project (the questions' defaults, config/train.yaml's lines for
the family, the README's words) and
its own rules. A family is one folder of models/ whose descriptor.py defines `FAMILY = Family(...)`
(or a subclass):

    models/gpt3/descriptor.py    the descriptor, torch-free to import
    models/gpt3/model.py         its nn.Module; the descriptor names the builder ("model:build_gpt3"),
                                 the exporter and the pipeline's layers as "<module>:<function>" of the folder
    models/gpt3/tests/           its own tests, collected in projects of that family

    family("gpt3").shape("1.3B")            # {"n_layer": 24, "n_embd": 2048, ...}
    family(cfg.model.arch).build(cfg, vocab) # the nn.Module, on the CPU

A folder is checked as it is loaded: a descriptor that does not import (a syntax error, a missing
module), a FAMILY that is no Family or is named otherwise than its folder, a field of another type
than Family declares, a formula left to Family's NotImplementedError. Each is one line naming the
file (and the line): a command that needs that family refuses with it, families() warns with it and
leaves the family out so that commands about the others go on, and copier (families(strict=True))
refuses the template with it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..settings.bounds import shown
from ..settings.config import ConfigError, Problem
from ..settings.optional_parts import without_family
from ..settings.packages import import_failure
from ..settings.stored_files import warn

MODELS = Path(__file__).resolve().parent
_DEFINES_FAMILY = re.compile(r"^FAMILY\s*[:=]", re.M)
DESCRIPTOR = "descriptor"  # the module of a family's folder that defines FAMILY

# models/lm_loss.py's CHUNK_LOGITS and CHUNKS_PER_HEAD_GRADIENT, repeated here where torch is not
# imported (a test holds them equal), and what eager holds per logit of a chunk at its peak: about
# four fp32 copies.
LOSS_CHUNK_LOGITS = 2**25
LOSS_CHUNKS_PER_HEAD_GRADIENT = 4
LOSS_CHUNK_BYTES_PER_LOGIT = 16


def block_params(h: int, tp: int = 1) -> int:
    """One GPT-2/3 or BERT block on one tensor-parallel rank: 12h^2 + 13h when tp = 1."""
    return (12 * h * h + 7 * h) // tp + 6 * h  # split: 4 matrices, qkv and fc biases; replicated: 2 biases, 2 norms


def chunked_loss_bytes(width: int, rows: int, tokens: int, matmul_bytes: int = 2) -> float:
    """What models/lm_loss.py's chunked loss holds at its peak for a micro batch of `tokens`
    positions: the two gradients forward computes and keeps for backward (the hidden states', tokens x
    width in the matmul's dtype; the head's, rows x width in fp32), one chunk's transients, a group of
    chunks' logit gradients in the matmul's dtype, and their product into the head's gradient before
    it is added in."""
    kept = tokens * width * matmul_bytes + rows * width * 4
    chunk = LOSS_CHUNK_LOGITS * (LOSS_CHUNK_BYTES_PER_LOGIT + LOSS_CHUNKS_PER_HEAD_GRADIENT * matmul_bytes)
    return kept + chunk + rows * width * matmul_bytes


def stage_layers(n_layer: int, pp: int) -> list[int]:
    """Blocks per pipeline stage (equal when pp divides the layers, as the rules require)."""
    return [n_layer // pp + (1 if i < n_layer % pp else 0) for i in range(pp)]


def transformer_layer_activations(
    shape: dict, seq: int, micro: int, tp: int, replicated: float, scores_stored: bool
) -> float:
    """Korthikanti et al. 2022 for a GPT-2/3 or BERT block: s*b*h*(replicated + 24/t) bytes (24/t: what
    the split heads and MLP keep; replicated: norms, block inputs, dropout masks, measured per family
    and precision), plus 5*a*s^2*b/t where the attention probabilities are stored."""
    scores = 5 * shape["n_head"] * seq * seq * micro / tp if scores_stored else 0
    return seq * micro * shape["n_embd"] * (replicated + 24 / tp) + scores


# schedule's other ways to say how long, commented out in a new project's train.yaml.
LENGTH_ALTERNATIVES = [
    (None, "", "epochs: 3            # instead of max_steps (set it to null): steps = ceil(train sequences x epochs / global batch), printed at train start"),
    (None, "", "tokens_per_param: 20 # or instead: steps = ceil(ratio x the model's parameters / tokens a step), printed at train start and by plan"),
]  # fmt: skip


@dataclass(frozen=True)
class StageLayer:
    """One layer of a family's pipeline: `kind(*args)` builds it (under its layer's seed). prefix: its
    weights' names in the one-process model's state dict (None: a tied copy, not saved again); tied: a
    key shared by the layers whose `tied_weights` are one tensor; forward: what the tied copy computes
    instead of its forward (the head from the embedding); block: it is a repeated block, the unit of
    stage partitioning, recomputation and the tensor split."""

    kind: Any
    args: tuple = ()
    prefix: str | None = None
    tied: str = ""
    tied_weights: tuple[str, ...] = ()
    forward: Any = None
    block: bool = False


@dataclass(frozen=True)
class PipelineLayers:
    """A family's model as the pipeline sees it: its layers in order, the loss of the last stage's
    output, the one-process model (built on the meta device for its sizes) and how a block splits
    over tensor ranks: Linear layers by output features (column) or by input features (row, whose
    bias is added once), and the norms every tensor rank keeps whole."""

    layers: list[StageLayer]
    loss: Any
    whole: Any
    column_parallel: tuple[str, ...] = ()
    row_parallel: tuple[str, ...] = ()
    block_norms: tuple[str, ...] = ()

    @property
    def block_type(self) -> str:
        return next(layer.kind.__name__ for layer in self.layers if layer.block)


@dataclass(frozen=True)
class Family:
    """A model family. The formulas take a shape (`shape(size)`), the vocabulary size V and the
    sequence length T; memory formulas count bytes."""

    name: str
    summary: str
    builder: str  # "<module of its folder>:<function(cfg, vocab_size, load_weights=True)>", imported when building
    # "<module of its folder>:<function(model) -> transformers model>": `export`'s conversion, exact (tests hold it)
    exporter: str = ""
    # "<module of its folder>:<function(cfg, vocab_size)>" -> PipelineLayers, what a pipeline cuts into
    # stages (families with layouts: strategies/deepspeed/pipeline.py builds DeepSpeed's PipelineModule from them)
    pipeline_layers: str = ""
    # "<module of its folder>:<function(cfg, data_dir, split)>": the family's own batches of a split
    # (bert's masked positions); "" for next-token pairs of the token stream (data/tokens.py)
    batches: str = ""
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)  # size name -> n_layer, n_embd, n_head (...)
    causal: bool = True  # next-token prediction (sample continues a prompt) or masked (sample fills [MASK])
    tokenizer: str = "bpe"  # what prepare-data trains: "bpe" (a BOS token) or "wordpiece" (BERT's specials)
    sample_top_k: int = 50  # sample's --top-k default: tokens sampled among, or predictions listed per [MASK]
    max_sequence_len: int | None = None  # learned position embeddings: the longest sequence
    min_sequence_len: int = 1
    grouped_query: bool = False  # model.n_kv_head applies
    attention_dropout: bool = True  # model.attention_dropout applies
    pretrained: bool = False  # model.pretrained (local weights) applies
    rotary: bool = False  # heads of even size (rotary embeddings pair dimensions)
    muon: bool = False  # its model names each parameter's role (param_roles): optim.optimizer=muon applies
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)  # named sizes with a cluster layout
    # The starting recipe copier writes into train.yaml (global and micro batch in sequences, peak lr,
    # sequence length, nominal parameters for the step budget), and what a size changes of it.
    recipe_defaults: dict[str, Any] = field(
        default_factory=lambda: {"global_batch": 256, "micro_batch": 16, "lr": 3e-4, "sequence_len": 2048}
    )
    recipe_by_size: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What copier asks and writes for a new project of the family (hooks/copier_extension.py reads them).
    title: str = ""  # the README's "A <title> trained with ...": {size} is the size answer
    default_size: str = ""  # model_size's default (a preset's size, for a family with presets)
    default_strategy: str = "deepspeed"  # the strategy question's default: ddp | deepspeed
    gpu_type: str = "h100-80gb"  # gpu_type's default (a preset names its own)
    recipes: tuple[str, ...] = ()  # gpt_recipe's choices, for a family with more than one recipe
    vocab_size: int = 32768  # data.vocab_size: the tokenizer prepare-data trains
    vocab_note: str = ""  # why that size, in train.yaml's comment
    exports_own_code: bool = False  # `export` may write the model's own modeling code (trust_remote_code)
    weight_decay: float = 0.1  # AdamW's, in a new project's train.yaml
    beta2: float = 0.95

    @property
    def layouts(self) -> bool:
        """Tensor and pipeline parallelism apply: the family gives its pipeline's layers."""
        return bool(self.pipeline_layers)

    # --- shapes --------------------------------------------------------------------------------------

    def recipe(self, size: str) -> dict[str, Any]:
        """global_batch, micro_batch, lr, sequence_len (and nominal params where known) for a size."""
        return {**self.recipe_defaults, **self.recipe_by_size.get(size, {})}

    def size_names(self) -> str:
        """The sizes a user may write in model.size, as the copier question's help lists them."""
        return ", ".join(self.sizes)

    def shape(self, size: str, n_kv_head: int | None = None, model=None) -> dict:
        """Layers, width, heads (and the published batch and lr where the table has them) of a size;
        `model` (cfg.model) adds the family's switches that change its formulas, where it has any."""
        if size not in self.sizes:
            raise ConfigError(f"model.size={size!r} is not a {self.name} size; use one of {', '.join(self.sizes)}")
        shape = dict(self.sizes[size])
        shape["n_kv_head"] = shape["n_head"] if n_kv_head is None else n_kv_head
        return shape

    # --- formulas (the nn.Module's num_params and flops_per_token equal these; tests hold them) ------

    def num_params(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        raise NotImplementedError(f"{self.name}: num_params")

    def flops_per_token(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        raise NotImplementedError(f"{self.name}: flops_per_token")

    def largest_layer_params(self, shape: dict, vocab_size: int) -> int:
        """The largest module's own parameters: what ZeRO-3 gathers at once."""
        return max(vocab_size * shape["n_embd"], 4 * shape["n_embd"] ** 2)

    def stage_params(self, shape: dict, vocab_size: int, sequence_len: int, tp: int, pp: int) -> list[int]:
        """Parameters one GPU holds per pipeline stage after the tensor split (no split: the model)."""
        return [self.num_params(shape, vocab_size, sequence_len)]

    def layer_activations(self, shape: dict, seq: int, micro: int, tp: int, mode: str, scores_stored: bool) -> float:
        """Bytes one block keeps for backward for one micro batch (mode: 'bf16' or 'autocast')."""
        raise NotImplementedError(f"{self.name}: layer_activations")

    def checkpointed_layer_bytes(self, mode: str) -> float:
        """Bytes per token per unit of width a checkpointed block keeps (its input)."""
        return 2 if mode == "bf16" else 4

    def logits_bytes(self, softcap: float) -> float:
        """Bytes per position per vocabulary entry of the logits and the loss, where the whole logits
        are computed (see loss_bytes)."""
        return 12

    def loss_bytes(self, shape: dict, vocab_size: int, tokens: int, softcap: float, chunked: bool = True) -> float:
        """Bytes the head and the loss hold at their peak for a micro batch of `tokens` positions.
        chunked: the model computes its training loss chunk by chunk where it can (models/lm_loss.py:
        DDP and ZeRO, not DeepSpeed's pipeline engine, whose loss_fn is given the whole logits); a
        family that does not holds the whole logits either way."""
        return tokens * vocab_size * self.logits_bytes(softcap)

    def scaling_params(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        """The parameters whose multiple is the compute-optimal number of tokens
        (schedule.tokens_per_param): every parameter, as Chinchilla counted."""
        return self.num_params(shape, vocab_size, sequence_len)

    def muon_params(self, shape: dict, vocab_size: int) -> int:
        """Parameters Muon steps under optim.optimizer=muon (none where the family has no roles)."""
        return 0

    def optimizer_groups(self, cfg, shape: dict) -> dict[str, dict]:
        """optim.optimizer=muon: the hyper-parameters of each parameter role the shape has, for this run
        (muon families)."""
        raise NotImplementedError(f"{self.name}: optimizer_groups")

    # --- what a new project's config/train.yaml says of the family ------------------------------------

    def config_settings(self, section: str, answers: dict) -> list[tuple[str | None, Any, str]]:
        """The family's lines of train.yaml's `section` ("model", "optim" or "schedule") for copier's
        answers (model_size, strategy, gpt_recipe, pretrained_dir): (key, value, comment) each; a key of
        None is a comment line of its own."""
        size, lr = answers["model_size"], self.recipe(answers["model_size"])["lr"]
        if section == "model":
            return [
                ("size", size, " | ".join(self.sizes)),
                ("sequence_len", self.recipe(size)["sequence_len"], "tokens per sequence"),
                ("dropout", None, "embedding and residual dropout (e.g. 0.1), masks per sample; null = none"),
            ]
        if section == "optim":
            return [
                ("optimizer", "adamw", "AdamW at lr for every parameter"),
                ("lr", lr, "AdamW peak learning rate"),
                ("weight_decay", self.weight_decay, ""),
                ("beta1", 0.9, ""),
                ("beta2", self.beta2, ""),
            ]
        if section == "schedule":
            return [
                ("max_steps", 20000, ""),
                *LENGTH_ALTERNATIVES,
                ("warmup_steps", 500, ""),
                ("decay", "cosine", "cosine to lr * min_lr_ratio | warmdown: constant, then linear over the last warmdown_ratio of the steps"),
                ("min_lr_ratio", 0.1, "cosine decays to lr * min_lr_ratio"),
            ]  # fmt: skip
        raise ValueError(f"no train.yaml section {section!r} of a family")

    # --- rules ---------------------------------------------------------------------------------------

    def problems(self, cfg, shape: dict) -> list[Problem]:
        """What this family refuses in a config, each naming the key and the fix."""
        m, name, found = cfg.model, self.name, []
        if cfg.optim.optimizer == "muon" and not self.muon:
            found.append(Problem(f"optim.optimizer=muon needs a model that names its matrices (model.arch=gpt), not "
                                 f"model.arch={name}; use optim.optimizer=adamw", "optim.optimizer", "model.arch"))  # fmt: skip
        elif cfg.optim.optimizer == "muon" and cfg.run.strategy != "ddp":
            found.append(Problem("optim.optimizer=muon runs under run.strategy=ddp: DeepSpeed's ZeRO steps flat shards "
                                 "of the parameters and Muon needs each matrix whole; use optim.optimizer=adamw with "
                                 "DeepSpeed, or run.strategy=ddp", "optim.optimizer", "run.strategy"))  # fmt: skip
        if not self.grouped_query and m.n_kv_head is not None:
            found.append(Problem(f"model.n_kv_head={m.n_kv_head} does not apply to model.arch={name}; set it to null",
                                 "model.n_kv_head", "model.arch"))  # fmt: skip
        if not self.attention_dropout and m.attention_dropout:
            found.append(Problem(f"model.attention_dropout={m.attention_dropout} does not apply to model.arch={name} "
                                 "(model.dropout is its embedding and residual dropout); set it to null",
                                 "model.attention_dropout", "model.arch"))  # fmt: skip
        if not self.pretrained and m.pretrained:
            found.append(Problem(f"model.pretrained={m.pretrained!r}: model.arch={name} starts from scratch; "
                                 'set it to ""', "model.pretrained", "model.arch"))  # fmt: skip
        if m.sequence_len < self.min_sequence_len:
            found.append(Problem(f"model.sequence_len={m.sequence_len} is too short for model.arch={name}; use at "
                                 f"least {self.min_sequence_len} (e.g. 128)", "model.sequence_len", "model.arch"))  # fmt: skip
        if self.max_sequence_len and m.sequence_len > self.max_sequence_len:
            found.append(Problem(f"model.sequence_len={m.sequence_len} exceeds {name}'s {self.max_sequence_len} "
                                 f"position embeddings; use at most {self.max_sequence_len}",
                                 "model.sequence_len", "model.arch"))  # fmt: skip
        if shape["n_kv_head"] < 1 or shape["n_head"] % shape["n_kv_head"]:
            found.append(Problem(f"model.n_kv_head={shape['n_kv_head']} must divide the {shape['n_head']} query heads "
                                 f"of model.size={m.size}; use a divisor of {shape['n_head']} or null",
                                 "model.n_kv_head", "model.size"))  # fmt: skip
        if shape["n_embd"] % shape["n_head"] or (self.rotary and shape["n_embd"] // shape["n_head"] % 2):
            even = " of even size (rotary embeddings pair dimensions)" if self.rotary else ""
            found.append(Problem(f"model.size={m.size} needs a width divisible into heads{even}; choose another size",
                                 "model.size"))  # fmt: skip
        return found

    # --- local weights (families with pretrained=True override these) -------------------------------

    def weights_folder(self, pretrained: str):
        """The model.pretrained folder, checked; families that take no local weights refuse it."""
        raise ConfigError(
            f'model.pretrained: model.arch={self.name} starts from scratch; set it to ""', key="model.pretrained"
        )

    def weights_vocab_size(self, pretrained: str) -> int:
        """The vocabulary size of the local weights, read without torch."""
        raise ConfigError(
            f'model.pretrained: model.arch={self.name} starts from scratch; set it to ""', key="model.pretrained"
        )

    # --- the model -----------------------------------------------------------------------------------

    def _function(self, named: str):
        """The function "<module>:<function>" names, in the family's folder; a ConfigError naming the
        module's file where it cannot be imported or lacks the function."""
        module, _, function = named.partition(":")
        package = (_HOMES.get(self.name) or type(self).__module__).rpartition(".")[0]
        path = MODELS / package.rpartition(".")[2] / f"{module.replace('.', '/')}.py"
        if not path.is_file() and not path.with_suffix("").is_dir():
            raise ConfigError(f"model.arch={self.name}: {path} does not exist (the descriptor names {named!r}); "
                              "write it or correct the descriptor", key="model.arch")  # fmt: skip
        try:
            found = getattr(importlib.import_module(f".{module}", package), function, None)
        except Exception as exc:  # a user's file: whatever its import raises is named with it
            raise ConfigError(f"model.arch={self.name}: {path} cannot be imported: {import_failure(exc, path)}; "
                              "fix it", key="model.arch") from None  # fmt: skip
        if not callable(found):
            raise ConfigError(f"model.arch={self.name}: {path} has no function {function} (the descriptor names "
                              f"{named!r}); define it or correct the descriptor", key="model.arch")  # fmt: skip
        return found

    def build(self, cfg, vocab_size: int, load_weights: bool = True):
        """A freshly initialised model on the CPU (with model.pretrained and load_weights: loaded)."""
        return self._function(self.builder)(cfg, vocab_size, load_weights)

    def open_batches(self, cfg, data_dir, split: str):
        """The family's own batches of a split (its `batches` function)."""
        return self._function(self.batches)(cfg, data_dir, split)

    def to_transformers(self, model):
        """The trained model as the transformers model that computes the same (`export`)."""
        if not self.exporter:
            raise ConfigError(f"model.arch={self.name} has no export to transformers (its descriptor sets no exporter)")
        return self._function(self.exporter)(model)

    def pipeline(self, cfg, vocab_size: int) -> PipelineLayers:
        """The layers a pipeline cuts into stages (and how its blocks split over tensor ranks)."""
        if not self.pipeline_layers:
            raise ConfigError(f"model.arch={self.name} has no pipeline layers; set parallel.pipeline=1 and "
                              "parallel.tensor=1", key="parallel.pipeline")  # fmt: skip
        return self._function(self.pipeline_layers)(cfg, vocab_size)


def peak_lrs_line(lrs: dict[str, float]) -> str:
    """Each optimizer role's peak learning rate, as the run's first line and plan show them."""
    return "peak lrs " + ", ".join(f"{role} {lr:.3g}" for role, lr in lrs.items())


def check_vocab(pretrained: str, model_vocab: int, tokenizer_vocab: int) -> None:
    """Local weights and their tokenizer must agree on the vocabulary."""
    if model_vocab != tokenizer_vocab:
        raise ConfigError(
            f"model.pretrained={pretrained!r} has vocab_size {model_vocab} but the tokenizer has {tokenizer_vocab} "
            "tokens; use the tokenizer these weights were trained with (its tokenizer.json or vocab.txt as "
            "data.tokenizer, or leave data.tokenizer empty to take the folder's) and run prepare-data again"
        )


_FOUND: dict[str, Family] = {}
_HOMES: dict[str, str] = {}  # family name -> the module defining it (plain Family instances)
_BROKEN: dict[str, str] = {}  # descriptor module -> why it cannot be loaded, said once per process


@functools.cache
def family_modules() -> tuple[str, ...]:
    """The descriptor modules of models/ that define a family ("gpt3.descriptor"), found without
    importing them (once)."""
    files = MODELS.glob(f"*/{DESCRIPTOR}.py")
    return tuple(
        sorted(
            f"{p.parent.name}.{DESCRIPTOR}"
            for p in files
            if _DEFINES_FAMILY.search(p.read_bytes().decode("utf-8", errors="replace"))
        )
    )


def families(strict: bool = False) -> dict[str, Family]:
    """Every family, by model.arch name (imports each family's module). A folder whose descriptor
    cannot be loaded is left out with a warning naming its file, so that commands about the other
    families go on; strict (copier, where the template itself is judged): its ConfigError."""
    for module in family_modules():
        try:
            _load(module)
        except ConfigError as exc:
            if strict:
                raise
            if module not in _WARNED:
                _WARNED.add(module)
                warn(f"{exc} (family {module.partition('.')[0]} left out)")
    return dict(sorted(_FOUND.items()))


_WARNED: set[str] = set()


def _load(module: str) -> Family:
    """The FAMILY of a descriptor module, checked; a ConfigError naming its file otherwise."""
    folder = module.partition(".")[0]
    path = MODELS / folder / f"{DESCRIPTOR}.py"
    if module not in _BROKEN:
        try:
            imported = importlib.import_module(f".{module}", __package__)
        except Exception as exc:  # a user's file: whatever its import raises is named with it
            _BROKEN[module] = import_failure(exc, path)
        else:
            problem = descriptor_problem(getattr(imported, "FAMILY", None), folder)
            if problem:
                _BROKEN[module] = problem
            else:
                _FOUND[folder] = imported.FAMILY
                _HOMES[folder] = imported.__name__
                return imported.FAMILY
    raise ConfigError(
        f"{path} cannot be loaded: {_BROKEN[module]}; fix it, or move the folder {path.parent} out of models/",
        key="model.arch",
    )


# What a descriptor's fields may hold beyond their types: the choices the project reads them against.
FIELD_CHOICES = {"tokenizer": ("bpe", "wordpiece"), "default_strategy": ("ddp", "deepspeed")}
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
SHAPE_KEYS = ("n_layer", "n_embd", "n_head")
RECIPE_KEYS = ("global_batch", "micro_batch", "lr", "sequence_len")
PRESET_KEYS = ("size", "nodes", "gpus_per_node", "tp", "pp")
FORMULAS = ("num_params", "flops_per_token", "layer_activations")  # Family's own raise NotImplementedError


def descriptor_problem(found, folder: str) -> str:
    """Why a descriptor's FAMILY cannot serve as the family of its folder, "" when it can: a Family
    (or subclass) named as its folder, each field of the type Family declares, the functions it names
    written "<module>:<function>", each size a shape of whole numbers."""
    if not isinstance(found, Family):
        return f"FAMILY is {type(found).__name__ if found is not None else 'not defined'}, not a Family (FAMILY = Family(...), or a subclass's)"
    if found.name != folder:
        return f"FAMILY.name {shown(repr(found.name), quoted=False)} is not its folder's name {folder!r}"
    hints = _field_types()
    for item in dataclasses.fields(Family):
        value = getattr(found, item.name)
        if not _holds(value, hints[item.name]):
            return f"FAMILY.{item.name}={shown(repr(value), quoted=False)} is not {_type_words(hints[item.name])}"
        if item.name in FIELD_CHOICES and value not in FIELD_CHOICES[item.name]:
            return f"FAMILY.{item.name}={value!r} is not one of {', '.join(FIELD_CHOICES[item.name])}"
    for name in ("builder", "exporter", "pipeline_layers", "batches"):
        value = getattr(found, name)
        if (value or name == "builder") and not _FUNCTION.fullmatch(value):
            return f'FAMILY.{name}={value!r} is not "<module>:<function>" of its folder (e.g. "model:build")'
    for formula in FORMULAS + (("optimizer_groups",) if found.muon else ()):
        if getattr(type(found), formula) is getattr(Family, formula):
            return (f"FAMILY's class defines no {formula}(...) of its own, which every family gives (a subclass "
                    "of Family with its formulas, as models/gpt3/descriptor.py has)")  # fmt: skip
    missing = [key for key in RECIPE_KEYS if key not in found.recipe_defaults]
    if missing:
        return f"FAMILY.recipe_defaults lacks {', '.join(missing)} (a new project's train.yaml is written from them)"
    for name, row in found.presets.items():
        if not all(key in row for key in PRESET_KEYS):
            return f"FAMILY.presets[{name!r}] needs {', '.join(PRESET_KEYS)} (copier's layout question reads them)"
    for size, shape in found.sizes.items():
        if not all(_holds(shape.get(key), int) and shape[key] >= 1 for key in SHAPE_KEYS):
            return f"FAMILY.sizes[{size!r}] needs {', '.join(SHAPE_KEYS)} as whole numbers of at least 1"
    return ""


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(Family)


def _holds(value, hint) -> bool:
    """Whether `value` is of the declared type `hint` (the forms Family's fields use)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_holds(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint in (int, float):  # a bool is no count; an int is a float's value too
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict) and all(_holds(k, args[0]) and _holds(v, args[1]) for k, v in value.items())
    if origin is tuple:  # tuple[X, ...]; a list serves as well
        return isinstance(value, (tuple, list)) and all(_holds(v, args[0]) for v in value)
    return isinstance(value, origin or hint)


def _type_words(hint) -> str:
    words = {str: "text", bool: "true or false", int: "a whole number", float: "a number"}
    return words.get(hint) or f"of the type {str(hint).replace('typing.', '')}"


def family(name: str) -> Family:
    """The family model.arch names; a ConfigError listing the families for any other name, or naming
    the file of the family's folder that cannot be loaded."""
    if name in _FOUND:
        return _FOUND[name]
    modules = family_modules()
    if f"{name}.{DESCRIPTOR}" in modules:
        return _load(f"{name}.{DESCRIPTOR}")
    descriptor = MODELS / name / f"{DESCRIPTOR}.py"
    if name.isidentifier() and descriptor.is_file():
        raise ConfigError(f"model.arch={name!r}: {descriptor} defines no FAMILY; end it with FAMILY = Family(...)",
                          key="model.arch")  # fmt: skip
    missing = without_family(name)
    if missing:
        raise missing
    names = sorted({*_FOUND, *(m.removesuffix(f".{DESCRIPTOR}") for m in modules)})
    raise ConfigError(
        f"model.arch={name!r} is not a model family; use one of {', '.join(names)} "
        f"(a new family is a folder of models/ whose {DESCRIPTOR}.py defines FAMILY)",
        key="model.arch",
    )


def model_shape(size: str, n_kv_head: int | None = None, arch: str = "gpt", model=None) -> dict:
    """The shape of a size of a family: family(arch).shape(size, n_kv_head, model)."""
    return family(arch).shape(size, n_kv_head, model)
