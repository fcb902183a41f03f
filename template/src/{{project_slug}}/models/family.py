"""What the project knows of a model family, in one place, and where families are found (no torch).

Everything outside models/ asks a family's descriptor and never the family's name. A family is one
folder of models/ whose descriptor.py defines `FAMILY = Family(...)` (or a subclass's instance):

    models/<family>/descriptor.py    the descriptor, torch-free to import
    models/<family>/model.py         its nn.Module; the descriptor names the builder ("model:build"),
                                     the exporter and its other hooks as "<module>:<function>" of the folder
    models/<family>/tests/           its own tests, collected in projects of that family

    family("gpt").shape("d20")               # {"n_layer": 20, "n_embd": 1280, ...}
    family(cfg.model.arch).build(cfg, vocab) # the nn.Module, on the CPU

The descriptor is read by several audiences, each in its own module: this one holds what builds,
trains, samples and exports the family (its shapes, its tokenizer and batches, the flags of the
settings it accepts, its optimizer groups); costs.py what planning prices (parameters, FLOPs,
activation and loss bytes); new_project.py what copier asks and writes; planning/rules.py the rules
its flags imply. Family inherits the last two's fields and methods, so a descriptor is one class.

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
from ..settings.optional_parts import TEMPLATE_STRATEGIES, without_family
from ..settings.packages import import_failure
from ..settings.stored_files import warn
from .costs import FORMULAS, Costs
from .new_project import NewProject

MODELS = Path(__file__).resolve().parent
_DEFINES_FAMILY = re.compile(r"^FAMILY\s*[:=]", re.M)
DESCRIPTOR = "descriptor"  # the module of a family's folder that defines FAMILY
# A family's tokenizer kind -> its name in prepare-data's lines. "bpe" is data/tokens.py's byte-level
# BPE; any other kind is the family's own (its tokenizer_trainer).
TOKENIZER_KINDS = {"bpe": "BPE", "wordpiece": "WordPiece"}


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


@dataclass(frozen=True, kw_only=True)
class Family(Costs, NewProject):
    """A model family: what builds, trains, samples and exports it (the formulas: Costs; copier's
    answers: NewProject)."""

    name: str
    summary: str
    builder: str  # "<module of its folder>:<function(cfg, vocab_size, load_weights=True)>", imported when building
    # "<module of its folder>:<function(model) -> transformers model>": `export`'s conversion, exact (tests hold it)
    exporter: str = ""
    # "<module of its folder>:<function(cfg, vocab_size)>" -> PipelineLayers, what a pipeline cuts into
    # stages (families with tensor and pipeline layouts)
    pipeline_layers: str = ""
    # "<module of its folder>:<function(cfg, split)>": the family's own batches of a split as
    # prepare-data wrote it (data/tokens.py PreparedSplit: a masked LM's predicted positions); "" for
    # next-token pairs of the token stream
    batches: str = ""
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)  # size name -> n_layer, n_embd, n_head (...)
    causal: bool = True  # next-token prediction (sample continues a prompt) or masked (its sampler fills masks)
    # What prepare-data makes of the text: a tokenizer of this kind (TOKENIZER_KINDS), documents
    # separated by `separator` ("" = the tokenizer's BOS token, data/tokens.py bos_id).
    tokenizer: str = "bpe"
    tokenizer_trainer: str = ""  # "<module>:<function(read_sample, vocab_size)>": its own kind, trained
    separator: str = ""
    # Tokens its data and model need, by transformers' names ({"mask_token": ...}, in id order for a
    # trained tokenizer): a given tokenizer must hold them, and an export names them.
    special_tokens: dict[str, str] = field(default_factory=dict)
    # Files of its own kind a tokenizer folder may hold: file name -> "<module>:<function(path)>"
    # reading one (a file given alone is read by the reader of the name with its suffix).
    tokenizer_files: dict[str, str] = field(default_factory=dict)
    # "<module>:<function(model, tok, prompt, top_k, device, autocast, context)> -> text": what
    # `sample` does with a prompt where the family does not continue it (causal=False).
    sampler: str = ""
    output_head: str = "lm_head"  # the name of its output Linear (fp8 leaves it in bf16)
    sample_top_k: int = 50  # sample's --top-k default: tokens sampled among, or predictions listed per mask
    max_sequence_len: int | None = None  # learned position embeddings: the longest sequence
    min_sequence_len: int = 1
    grouped_query: bool = False  # model.n_kv_head applies
    attention_dropout: bool = True  # model.attention_dropout applies
    pretrained: bool = False  # model.pretrained (local weights) applies
    rotary: bool = False  # heads of even size (rotary embeddings pair dimensions)
    muon: bool = False  # its model names each parameter's role (param_roles): optim.optimizer=muon applies

    @property
    def layouts(self) -> bool:
        """Tensor and pipeline parallelism apply: the family gives its pipeline's layers."""
        return bool(self.pipeline_layers)

    def shape(self, size: str, n_kv_head: int | None = None, model=None) -> dict:
        """Layers, width, heads (and the published batch and lr where the table has them) of a size;
        `model` (cfg.model) adds the family's switches that change its formulas, where it has any."""
        if size not in self.sizes:
            raise ConfigError(f"model.size={size!r} is not a {self.name} size; use one of {', '.join(self.sizes)}")
        shape = dict(self.sizes[size])
        shape["n_kv_head"] = shape["n_head"] if n_kv_head is None else n_kv_head
        return shape

    def optimizer_groups(self, cfg, shape: dict) -> dict[str, dict]:
        """optim.optimizer=muon: the hyper-parameters of each parameter role the shape has, for this run
        (muon families)."""
        raise NotImplementedError(f"{self.name}: optimizer_groups")

    def problems(self, cfg, shape: dict) -> list[Problem]:
        """What this family refuses in a config beyond what its flags imply (planning/rules.py
        family_problems): none here; a family with rules of its own overrides this."""
        return []

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

    def open_batches(self, cfg, split):
        """The family's own batches of a prepared split (its `batches` function)."""
        return self._function(self.batches)(cfg, split)

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

    def train_own_tokenizer(self, read_sample, vocab_size: int):
        """A tokenizer of the family's own kind trained on read_sample(purpose)'s texts (tokenizer_trainer)."""
        return self._function(self.tokenizer_trainer)(read_sample, vocab_size)

    def read_tokenizer_file(self, name: str, path: Path):
        """The tokenizer in `path`, a file of its kind named as `name` of tokenizer_files."""
        return self._function(self.tokenizer_files[name])(path)

    def sample(self, model, tok, prompt: str, top_k: int, device, autocast, context: int) -> str:
        """What `sample` makes of a prompt where the family does not continue it (its sampler)."""
        if not self.sampler:
            raise ConfigError(f"model.arch={self.name} continues no prompt and its descriptor names no sampler")
        return self._function(self.sampler)(model, tok, prompt, top_k, device, autocast, context)


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
    """The descriptor modules of models/ that define a family ("gpt.descriptor"), found without
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
FIELD_CHOICES = {"tokenizer": tuple(TOKENIZER_KINDS), "default_strategy": TEMPLATE_STRATEGIES}
# The fields that name a "<module>:<function>" of the family's folder.
FUNCTIONS = ("builder", "exporter", "pipeline_layers", "batches", "tokenizer_trainer", "sampler")
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
SHAPE_KEYS = ("n_layer", "n_embd", "n_head")
RECIPE_KEYS = ("global_batch", "micro_batch", "lr", "sequence_len")
PRESET_KEYS = ("size", "nodes", "gpus_per_node", "tp", "pp")


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
    named = {f"FAMILY.{name}": getattr(found, name) for name in FUNCTIONS}
    named |= {f"FAMILY.tokenizer_files[{file!r}]": reader for file, reader in found.tokenizer_files.items()}
    for name, value in named.items():
        if (value or name == "FAMILY.builder") and not _FUNCTION.fullmatch(value):
            return f'{name}={value!r} is not "<module>:<function>" of its folder (e.g. "model:build")'
    if found.tokenizer != "bpe" and not found.tokenizer_trainer:
        return f"FAMILY.tokenizer={found.tokenizer!r} is its own kind: name its tokenizer_trainer"
    for formula in FORMULAS + (("optimizer_groups",) if found.muon else ()):
        if getattr(type(found), formula) is getattr(Family, formula):
            return (f"FAMILY's class defines no {formula}(...) of its own, which every family gives (a subclass "
                    "of Family with its formulas, as models/gpt/descriptor.py has)")  # fmt: skip
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
