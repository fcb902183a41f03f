"""Typed training configuration: config/train.yaml plus command-line overrides.

Precedence: command line (`key=value` or `--set key=value`) > YAML file > dataclass defaults.
Every section is a dataclass; the docstring under each field says what it means and its unit.
Also where the project's files are (project_root, under_root, read_env_file).
A user mistake (unknown key, wrong type) raises ConfigError naming the key and the fix; the CLI
prints it without a traceback. This module imports no torch so `check` runs anywhere.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import hashlib
import importlib
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .sharding import Sharding
from .stored_files import ConfigError, DamagedFile, one_line, read_text


class Problem(str):
    """A rule's message (the string itself, so callers print, join and compare it as text) with
    `fix_key`, the config key whose change is the fix, and `keys`, every key the rule relates
    (fix_key first): Problem("parallel.tensor=16 exceeds ...", "parallel.tensor", "cluster.gpus_per_node")."""

    __slots__ = ("fix_key", "keys")

    def __new__(cls, message: str, fix_key: str, *other_keys: str) -> Problem:
        problem = super().__new__(cls, message)
        object.__setattr__(problem, "fix_key", fix_key)
        object.__setattr__(problem, "keys", tuple(dict.fromkeys((fix_key, *other_keys))))
        return problem

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"Problem is immutable: cannot set {name}")

    def __reduce__(self):
        return type(self), (str(self), *self.keys)


def debug_requested(cfg: Config | None = None) -> bool:
    """run.debug in the config or TRAIN_DEBUG=1 in the environment (the launchers set it)."""
    env = os.environ.get("TRAIN_DEBUG", "").lower() in ("1", "true", "yes", "on")
    return env or bool(cfg is not None and cfg.run.debug)


@dataclass
class ClusterConfig:
    nodes: int = 1
    """Machines a full-size run uses (a copier answer: change it with `copier update --data nodes=N`)."""
    gpus_per_node: int = 8
    """Training processes per machine, one per GPU (a copier answer)."""
    gpu_type: str = "h100-80gb"
    """GPU model, for `plan`'s memory fit and time estimate (a copier answer)."""
    max_restarts: int = 3
    """torchrun restarts of a node's workers after a failure (a rank crashed, a node left); each
    restart resumes from the latest checkpoint. 0 = fail at the first error."""
    stop_grace_seconds: int = 120
    """After SIGTERM/SIGUSR1 (preemption, a deleted job, a scheduler's time-limit warning), how long
    torchrun lets the ranks finish their step and save before it kills them. Keep the platform's grace
    period (its launch/<platform>/README says which setting) at least this long."""


@dataclass
class ModelConfig:
    arch: str = "gpt"
    """Model family, a copier answer: a folder of models/ whose descriptor defines FAMILY."""
    size: str = "d20"
    """One of the family's sizes (models/<arch>/descriptor.py; `plan` lists them). gpt: 'tiny' or
    'd<depth>' (width 64*depth, heads of 128)."""
    n_kv_head: int | None = None
    """gpt only: key/value heads for grouped-query attention; null = as many as query heads."""
    sequence_len: int = 2048
    """Tokens per training sequence (context length)."""
    softcap: float = 15.0
    """gpt only: logits are squashed to (-softcap, softcap) with tanh; 0 disables."""
    pretrained: str = ""
    """A family with pretrained weights only: local folder with config.json and weights to start from
    (fine-tuning); empty = from scratch with the shape of `size`. Nothing is downloaded (HF_HUB_OFFLINE=1)."""
    dropout: float | None = None
    """Hidden dropout, masks per sample (any layout, same losses); null = none (or model.pretrained's)."""
    attention_dropout: float | None = None
    """Attention-probability dropout, in families that have it; null = none (the fused flash kernel);
    above 0 the T x T probabilities are materialised (0.1 in the classic recipes, at the cost plan shows)."""
    activation_checkpointing: bool = False
    """Recompute activations in backward instead of keeping them: ~1/3 more compute, far less memory."""
    # gpt: nanochat's pieces (models/gpt/model.py); off by default, a new project's train.yaml turns them on.
    value_embeddings: bool = False
    """gpt: value embeddings on alternating layers (the last included), gated per key/value head."""
    residual_scalars: bool = False
    """gpt: learned per-layer scales of the residual stream and of the input embedding mixed back in."""
    smear: bool = False
    """gpt: each position takes in a gated share of the previous token's embedding."""
    backout: bool = False
    """gpt: a learned share of the middle layer's residual stream is taken out before the head."""
    qk_scale: float = 1.0
    """gpt: queries and keys are multiplied by this after QK-norm."""
    rotary_base: float = 10000.0
    """gpt: base of the rotary frequencies."""
    init: str = "unit"
    """gpt: 'unit' (embedding std 1) or 'scaled' (embedding std 0.8, MLP input matrix 0.4x)."""
    vocab_multiple: int = 1
    """gpt: the embedding and head tables' rows rounded up to this multiple (nanochat's 64: the head's
    matmul on the GPU's tiles); the logits past the vocabulary are cut off."""
    window_pattern: str = "L"
    """gpt: attention per layer, tiled: S a sliding window of a quarter of the sequence, L the whole
    (nanochat's SSSL); the last layer always sees the whole. Compiled on a GPU a window runs as flex
    attention (what it hides is skipped), elsewhere as a mask to SDPA."""


@dataclass
class DataConfig:
    dir: str = "data"
    """Folder on shared storage with raw/ (inputs), tokenizer.json and the packed token shards."""
    raw: str = ""
    """Input files for prepare-data (glob, relative to `dir` or absolute); empty = raw/* in `dir`."""
    tokenizer: str = ""
    """Existing tokenizer: a tokenizer.json, a transformers tokenizer folder, GPT-2's vocab.json +
    merges.txt, a WordPiece vocab.txt, or a folder holding one (data/tokens.py load_tokenizer); empty =
    train one into `dir`/tokenizer.json."""
    vocab_size: int = 32768
    """Vocabulary size when prepare-data trains the tokenizer."""
    tokenizer_train_chars: int = 1_000_000_000
    """Characters of raw text the tokenizer is trained on (the rest is only encoded)."""
    val_fraction: float = 0.005
    """Share of documents held out for the validation shard."""
    rows: str = "windows"
    """Causal families' training rows: 'windows' (the token stream cut every sequence_len tokens) or
    'documents' (each row starts at a document, documents packed best-fit, the shortest cut to fill a
    row: nanochat's; data/document_rows.py). Validation reads windows either way."""
    shard_tokens: int = 100_000_000
    """Tokens per training shard file."""


@dataclass
class OptimConfig:
    optimizer: str = "adamw"
    """'adamw' (every parameter at optim.lr) or 'muon' (gpt under ddp: Muon for the blocks' matrices,
    AdamW for the rest, at the *_lr below: nanochat's for 2^19 tokens a step and width 768, scaled to
    this run's batch and width; `plan` prints them)."""
    lr: float = 3e-4
    """Peak learning rate of AdamW (optim.optimizer=adamw)."""
    weight_decay: float = 0.1
    """adamw: decoupled, on matrices. muon: Muon's cautious decay at the reference, scaled, to 0 at the end."""
    matrix_lr: float = 0.02
    embedding_lr: float = 0.3
    unembedding_lr: float = 0.008
    scalar_lr: float = 0.5
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables."""
    max_skipped_steps: int = 3
    """The divergence guard (training/divergence.py): a step whose loss or gradient norm is not finite
    is not applied, and this many such steps in a row stop the run with one line naming the newest
    checkpoint to resume from with a lower rate (checked at the logging steps); 0: skip them, never stop."""
    loss_spike_factor: float = 0.0
    """Also leave out a step whose loss exceeds this factor times the running mean of the applied
    steps' losses (e.g. 3); 0: off. Not where the strategy applies its update before a verdict."""


@dataclass
class ScheduleConfig:
    max_steps: int | None = 20000
    """Optimizer steps of the whole run; null when schedule.epochs gives the length instead."""
    epochs: float | None = None
    """Passes over the prepared train split instead of max_steps (which must then be null); may be
    fractional (0.5). Train start derives max_steps = ceil(train sequences x epochs / global batch)
    from the prepared data (data/epochs.py) and prints it; null = max_steps gives the length."""
    tokens_per_param: float | None = None
    """Training tokens as a multiple of the model's scaling parameters instead of max_steps (which must
    then be null): max_steps = ceil(ratio x parameters / (global batch x sequence_len)), printed at
    the start and by plan. gpt counts nanochat's way (the blocks' matrices and the head; its default
    ratio is 12), other families every parameter (Chinchilla's ratio is ~20)."""
    warmup_steps: int = 500
    """Steps of linear warmup from 0 to the peak learning rate."""
    min_lr_ratio: float = 0.1
    """The decay ends at lr * min_lr_ratio."""
    decay: str = "cosine"
    """'cosine' after warmup, or 'warmdown': constant, then linear over the last warmdown_ratio of the steps."""
    warmdown_ratio: float = 0.65

    def length_problem(self) -> str | None:
        """One line when the run's length is given more than once (max_steps, epochs, tokens_per_param)
        or not at all."""
        given = [n for n in ("max_steps", "epochs", "tokens_per_param") if getattr(self, n) is not None]
        if len(given) > 1:
            shown = " and ".join(f"schedule.{n}={getattr(self, n):g}" for n in given)
            keep = next(n for n in given if n != "max_steps")  # max_steps is train.yaml's; the other was added
            drop = ", ".join(f"schedule.{n}=null" for n in given if n != keep)
            both = "both" if len(given) == 2 else "all"
            return f"{shown} are {both} set; keep one: {drop} to train by schedule.{keep}={getattr(self, keep):g}"
        if not given:
            return (
                "schedule.max_steps, schedule.epochs and schedule.tokens_per_param are all null; set one, "
                "e.g. schedule.max_steps=20000"
            )
        return None


@dataclass
class BatchConfig:
    global_batch_size: int = 256
    """Sequences per optimizer step across all data-parallel ranks."""
    micro_batch_size: int = 16
    """Sequences per forward/backward pass on one rank."""
    grad_accum_steps: int | None = None
    """Micro steps per optimizer step; null = derived as global / (micro * data-parallel size)."""
    scaling: str = "strong"
    """Another number of GPUs than cluster.* keeps: 'strong' the global batch (accumulation is derived),
    'weak' the batch per GPU (global_batch_size is then the one of cluster.nodes x gpus_per_node)."""


@dataclass
class CheckpointConfig:
    every_steps: int = 1000
    """Save every N optimizer steps (and at the end); 0 = only at the end."""
    keep_last: int = 3
    """Checkpoints kept on disk; older ones are deleted after a successful save."""
    resume: bool = True
    """Continue from the newest intact checkpoint in output_dir/checkpoints when one exists. false:
    this is a new run, refused on a folder that holds an earlier one (never overwritten)."""
    reshard: bool = False
    """Allow resuming a checkpoint written by another number of data-parallel ranks (the data stream
    depends on the global batch alone). DDP loads its replicas on any size; a sharded strategy's
    checkpoint is converted once to a format of any size, kept beside it
    (checkpoints/universal/). The continuation is equal up to reduction order, not bitwise. The
    tensor and pipeline degrees cannot change."""


@dataclass
class LoggingConfig:
    every_steps: int = 10
    """Write a metrics line (console, metrics.jsonl, the trackers) every N steps."""
    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Where metrics go besides metrics.jsonl, on rank 0: any of tensorboard, mlflow, wandb
    (tracking/). A YAML list, or `logging.trackers=tensorboard,mlflow` on the command line; [] or
    none: metrics.jsonl only."""
    tensorboard: bool = True
    """Older configs' switch for TensorBoard: false leaves it out of logging.trackers."""
    eval_every_steps: int = 1000
    """Validation loss every N steps; 0 = only at the end."""
    eval_batches: int = 20
    """Micro batches per rank used for validation."""


@dataclass
class EvalConfig:
    bundle_dir: str = ""
    """Task bundle in CORE's layout (core.yaml, eval_meta_data.csv, eval_data/); empty = data.dir/eval_bundle."""
    tasks_every_steps: int = 0
    """Score the bundle's tasks (capped) every N steps during training, per task and CORE; 0 = never."""
    tasks_max_per_task: int = 100
    """Items per task at those steps (a fixed shuffle); `eval --tasks` scores all by default."""


@dataclass
class RunConfig:
    output_dir: str = "runs"
    """Folder on shared storage for checkpoints, metrics.jsonl, TensorBoard and the resolved config."""
    seed: int = 1337
    device: str = "auto"
    """'auto' (CUDA when present), 'cuda' or 'cpu'."""
    dtype: str = "auto"
    """'auto' (bf16 on a GPU with bf16, fp16 loss-scaled on an older one, fp32 on CPU), 'bf16', 'fp16'
    or 'fp32': precision.py."""
    compile: bool = True
    """torch.compile the model on CUDA under every strategy (a slower start, faster steps); CPU: eager."""
    fp8: str = "off"
    """'off', 'tensorwise' or 'rowwise': the blocks' linear layers multiply in fp8 (torchao's float8
    training, one scale per tensor or per row) on a GPU with fp8 (compute capability 8.9 on: H100,
    H200, L40S); needs bf16 and run.compile on the GPU. On a CPU it is emulated (tests)."""
    strategy: str = "ddp"
    """'ddp' (torch DistributedDataParallel), or a strategy folder's name (strategies/<name>/, whose
    settings are a section of their own)."""
    debug: bool = False
    """Hang forensics, same as TRAIN_DEBUG=1: per-rank log files, config/nccl-debug.env (NCCL INFO,
    flight recorder dumps on a timeout, desync report) and collectives time out after
    debug_timeout_minutes instead of collective_timeout_minutes."""
    collective_timeout_minutes: float = 10.0
    """How long a collective may wait for the other ranks before the process group aborts."""
    debug_timeout_minutes: float = 2.0
    """The collective timeout under run.debug / TRAIN_DEBUG=1: a hang surfaces (and dumps) sooner."""
    start_timeout_minutes: float = 3.0
    """How long a rank waits for the process group to start (every rank at the store, then the
    backend's connections) before it exits 1 in one line naming whom it waited for, so torchrun's
    next restart or the job's end follows; at most half the collective timeout in force."""
    first_step_timeout_minutes: float = 30.0
    """A rank that has not finished its first step this long after it started (loading, compiling,
    the first collectives) prints its Python stacks and exits 1, so the platform's restart policy can
    act; 0: wait forever."""


@dataclass
class ParallelConfig:
    tensor: int = 1
    """Tensor-parallel degree (a family with layouts): each layer's matrices split over this many GPUs of a node."""
    pipeline: int = 1
    """Pipeline-parallel degree (a family with layouts): the layers split into this many stages."""


# Model settings added after checkpoints were first fingerprinted: at their defaults (the model
# without them) they stay out of the fingerprint, so earlier checkpoints resume.
LATER_MODEL_FIELDS = (
    "value_embeddings",
    "residual_scalars",
    "smear",
    "backout",
    "qk_scale",
    "rotary_base",
    "init",
    "window_pattern",
    "vocab_multiple",
)


@dataclass
class Config:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # Not a field (no annotation): the "section.key"s the file and the command line gave, so a rule can
    # tell a setting written at its default from one left out. Empty for a Config built in code.
    given_keys = frozenset()

    def data_parallel_size(self, world_size: int) -> int:
        """Ranks that hold a full model replica: world / (tensor x pipeline)."""
        return max(1, world_size // (self.parallel.tensor * self.parallel.pipeline))

    def sharding(self) -> Sharding:
        """How far run.strategy shards (its section's sharding, where a strategy folder has one), else stage 0."""
        for part in PART_SECTIONS:
            if getattr(part, "STRATEGY", None) == self.run.strategy:
                return part.sharding(getattr(self, part.NAME))
        return Sharding()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def model_fingerprint(self) -> str:
        """Hash of the settings a checkpoint cannot outlive (shape of model and data stream)."""
        # Settings that do not change the weights stay out; so do new fields at their defaults,
        # which keeps checkpoints of earlier template versions resumable.
        unchanged = {("arch", "gpt"), ("pretrained", "")} | {(k, getattr(ModelConfig, k)) for k in LATER_MODEL_FIELDS}
        model = {
            k: v
            for k, v in dataclasses.asdict(self.model).items()
            if k != "activation_checkpointing" and (k, v) not in unchanged
        }
        key = {"model": model, "global_batch_size": self.batch.global_batch_size}
        if (self.parallel.tensor, self.parallel.pipeline) != (1, 1):
            key["parallel"] = dataclasses.asdict(self.parallel)  # shards of a layout do not fit another
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _part_sections() -> list[types.ModuleType]:
    """The config sections of the strategy folders the project holds (strategies/<name>/settings.py:
    NAME, SECTION, CHOICES, check), which a project made without them does not read."""
    package = __package__.rpartition(".")[0]
    return [
        importlib.import_module(f"{package}.strategies.{path.parent.name}.settings")
        for path in sorted((Path(__file__).resolve().parents[1] / "strategies").glob("*/settings.py"))
    ]


PART_SECTIONS = _part_sections()
if PART_SECTIONS:  # Config with a field per part section, after the shared ones
    Config = dataclasses.make_dataclass(
        "Config",
        [(part.NAME, part.SECTION, field(default_factory=part.SECTION)) for part in PART_SECTIONS],
        bases=(Config,),
    )
    Config.__module__ = __name__


# Where the project is, and the KEY=VALUE files it keeps (config/nccl.env, config/nccl-debug.env),
# read the way shells and env_file do.
def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines; '#' starts a comment; blank lines are skipped; a missing file is empty."""
    values = {}
    if path.is_file():
        for line in read_text(path, fix="save it as UTF-8 text (KEY=VALUE lines)").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                key, sep, value = line.partition("=")
                if sep:
                    values[key.strip()] = value.strip().strip("'\"")
    return values


def project_root() -> Path:
    """The folder holding config/ (the working directory in the image, else the source checkout)."""
    here = Path.cwd()
    return here if (here / "config").is_dir() else Path(__file__).resolve().parents[3]


def under_root(path: str | Path) -> Path:
    """An absolute path as it is; a relative one (run.output_dir=runs) from the project root."""
    path = Path(path)
    return path if path.is_absolute() else project_root() / path


def default_config_path() -> Path:
    """config/train.yaml in the working directory, else the one beside the installed project."""
    here = Path("config/train.yaml")
    if here.is_file():
        return here
    return Path(__file__).resolve().parents[3] / "config" / "train.yaml"


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """--config and --set of every command (load_config's path and overrides)."""
    p.add_argument("--config", help="YAML config (default: config/train.yaml)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set optim.lr=1e-3; a bare KEY=VALUE argument works too",
    )


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Read YAML, apply `section.key=value` overrides, return a validated Config. The project's own
    config file must hold settings; a file given by path may be empty (the code's defaults)."""
    own = not path
    path = Path(path) if path else default_config_path()
    if not path.is_file():
        raise ConfigError(f"config file {path} not found; pass --config PATH or run from the project folder")
    text = read_text(path, fix="save it as UTF-8 text")
    # A conflicting `copier update` (or git merge) leaves markers that may still parse as YAML.
    markers = [
        n
        for n, line in enumerate(text.splitlines(), 1)
        if line.startswith(("<<<<<<<", ">>>>>>>")) or line.rstrip() == "======="
    ]
    if markers:
        raise ConfigError(
            f"unresolved merge conflict markers in {path} (lines {', '.join(map(str, markers[:6]))}): "
            "resolve them (keep one side between <<<<<<< and >>>>>>>), then run check again"
        )
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        what = one_line(getattr(exc, "problem", None) or exc)
        raise DamagedFile(
            path,
            f"not valid YAML ({what})",
            "correct that line: `key: value` under each section",
            mark and mark.line + 1,
        ) from None
    if raw is None and own:  # emptied by a slip or a failed write: not the run it was written for
        raise ConfigError(
            f"{path} holds no settings (empty, or comments only); restore it (`git checkout -- {path.name}` in "
            "its folder, or `copier update`), or pass --config FILE for the code's defaults"
        )
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (model:, data:, ...)")
    cfg, given, written = Config(), set(), _as_written(text)
    for section_name, values in raw.items():
        section = _section(cfg, section_name, str(path))
        if not isinstance(values, dict):
            raise ConfigError(f"{section_name} in {path} must be a mapping of keys, got {values!r}")
        texts = written.get(section_name) if isinstance(section_name, str) else None
        for key, value in values.items():
            text = texts.get(key) if isinstance(texts, dict) and isinstance(key, str) else None
            _assign(section, section_name, key, value, source=str(path), from_text=False, written=text)
            given.add(f"{section_name}.{key}")
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"override {item!r} must look like section.key=value, e.g. optim.lr=1e-3")
        section_name, _, name = key.strip().partition(".")
        section = _section(cfg, section_name, "the command line")
        _assign(section, section_name, name, text.strip(), source="the command line", from_text=True)
        given.add(f"{section_name}.{name}")
    _check_choices(cfg)
    cfg.given_keys = frozenset(given)
    return cfg


def _as_written(text: str) -> dict:
    """The YAML document with every value as the text written (YAML's BaseLoader reads no types): where
    YAML 1.1 read an unquoted word or number as something else (off as false, 1.10 as 1.1, 010 as 8)."""
    try:
        document = yaml.load(text, Loader=yaml.BaseLoader)  # builds only str, list and dict
    except yaml.YAMLError:
        return {}
    return document if isinstance(document, dict) else {}


def save_config(cfg: Config, path: Path, comment: str = "") -> None:
    """The config as YAML that --config reads back; comment: a first line starting with '#'."""
    path.write_text((f"# {comment}\n" if comment else "") + yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def _section(cfg: Config, name: str, source: str):
    names = [f.name for f in dataclasses.fields(cfg)]
    if name not in names:
        from .optional_parts import without_section

        absent = without_section(name)
        if absent:
            raise absent
        raise ConfigError(
            f"unknown section '{name}' in {source}{_did_you_mean(str(name), names)}; sections are {', '.join(names)}"
        )
    return getattr(cfg, name)


def _assign(
    section, section_name: str, key: str, value: Any, source: str, from_text: bool, written: str | None = None
) -> None:
    """Set one setting from YAML (written: its text, where YAML read a type) or the command line."""
    fields = {f.name: f for f in dataclasses.fields(section)}
    if key not in fields:
        raise ConfigError(
            f"unknown key '{section_name}.{key}' in {source}{_did_you_mean(str(key), list(fields), section_name + '.')}; "
            f"keys of {section_name}: {', '.join(fields)}"
        )
    hint = typing.get_type_hints(type(section))[key]
    name = f"{section_name}.{key}"
    value = _coerce(value, hint, name, source, from_text, written)
    allowed = CHOICES.get(name, ())
    if isinstance(value, str) and value not in allowed:
        value = _switch_choice(value, allowed)
    setattr(section, key, value)


# What YAML 1.1 reads as false or true: a setting whose choices name an off (or on) state takes them
# as that state (`fp8: off` unquoted is YAML's false, and so is `fp8: no`).
FALSE_WORDS = ("false", "no", "off")
TRUE_WORDS = ("true", "yes", "on")
OFF_CHOICES = ("off", "none", "disabled")
ON_CHOICES = ("on", "enabled")


def _switch_choice(text: str, allowed: tuple) -> str:
    """The off (on) choice for a false (true) word where the choices have one; else the text."""
    for words, states in ((FALSE_WORDS, OFF_CHOICES), (TRUE_WORDS, ON_CHOICES)):
        if text.lower() in words:
            return next((choice for choice in allowed if choice in states), text)
    return text


def _decimal_reading(text: str, value: float) -> bool:
    """Whether `text` read as decimal digits is `value` (not YAML 1.1's octal 010, hex 0x10, base-60 1:30)."""
    digits = text.replace("_", "")
    try:
        return (int(digits) if isinstance(value, int) else float(digits)) == value
    except (ValueError, OverflowError):
        return False


# Digits as Python reads them, underscores only between groups of three (1_000_000): "1_0" is a
# slip of the keyboard that int() would read as 10.
DIGITS = r"(?:[0-9]+|[0-9]{1,3}(?:_[0-9]{3})+)"
THOUSANDS_FLOAT = rf"\s*[+-]?{DIGITS}(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?\s*"


def _coerce(value: Any, hint: Any, name: str, source: str, from_text: bool, written: str | None = None) -> Any:
    """Turn a YAML value (written: its text) or command-line text into the field's type, or raise naming the key."""
    optional = isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    if optional and (value is None or (from_text and str(value).lower() in ("null", "none", ""))):
        return None
    wrong = ConfigError(f"{name} in {source}: expected {_type_word(base, optional)}, got {value!r}", key=name)
    number = base in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool)
    finite = number and (isinstance(value, int) or math.isfinite(value))  # .inf and .nan: bounds.py refuses them
    if finite and isinstance(written, str) and not _decimal_reading(written, value):
        raise ConfigError(
            f"{name} in {source}: YAML reads {written} as {value} (an octal, hex or base-60 number); write it in "
            f"decimal digits ({name.partition('.')[2]}: {value} if that is what you meant)",
            key=name,
        )
    if base is bool:
        if isinstance(value, bool):
            return value
        if from_text and str(value).lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return str(value).lower() in ("true", "yes", "on", "1")
        raise wrong
    if base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(rf"[+-]?{DIGITS}", value.strip()):
            return int(value.replace("_", ""))
        raise wrong
    if base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        # float() also reads other scripts' digits, and underscores anywhere ("1_0" is 10)
        if isinstance(value, str) and value.isascii() and ("_" not in value or re.fullmatch(THOUSANDS_FLOAT, value)):
            try:
                return float(value)
            except ValueError:
                raise wrong from None
        raise wrong
    if typing.get_origin(base) is list:  # names: a YAML list, or one text of names split by commas
        if from_text or isinstance(value, str):
            text = str(value).strip()
            value = [] if text.lower() in ("", "none", "[]") else text.strip("[]").split(",")
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise wrong
        return [v.strip() for v in value]
    if base is str:
        if isinstance(value, (dict, list)) or value is None:
            raise wrong
        if not isinstance(value, str) and isinstance(written, str):
            return written  # an unquoted off, yes, 1.10 or 0755 that YAML read as a bool or a number
        return str(value)
    raise AssertionError(f"unsupported field type {hint} for {name}")


def _type_word(base: Any, optional: bool) -> str:
    if typing.get_origin(base) is list:
        return "a list of names (name1,name2 on the command line)"
    word = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[base]
    return word + (" or null" if optional else "")


def _did_you_mean(name: str, options: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, options, n=1)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


# The settings that take one of a few words (or numbers); run.strategy: ddp and each strategy folder.
STRATEGY_FOLDERS = Path(__file__).resolve().parents[1] / "strategies"
CHOICES = {
    "run.device": ("auto", "cuda", "cpu"),
    "run.dtype": ("auto", "bf16", "fp16", "fp32"),
    "run.fp8": ("off", "tensorwise", "rowwise"),
    "run.strategy": ("ddp", *sorted(p.parent.name for p in STRATEGY_FOLDERS.glob("*/__init__.py"))),
    "optim.optimizer": ("adamw", "muon"),
    "schedule.decay": ("cosine", "warmdown"),
    "data.rows": ("windows", "documents"),
    "model.init": ("unit", "scaled"),
    "batch.scaling": ("strong", "weak"),
}
for _part in PART_SECTIONS:
    CHOICES.update(_part.CHOICES)
# The list settings, each item one of a few words.
LIST_CHOICES = {"logging.trackers": ("tensorboard", "mlflow", "wandb")}


def _check_choices(cfg: Config) -> None:
    for name, allowed in CHOICES.items():
        section, key = name.split(".")
        value = getattr(getattr(cfg, section), key)
        if value not in allowed:
            from .optional_parts import without_choice

            raise without_choice(name, value) or ConfigError(
                f"{name}={value!r} is not one of {', '.join(map(str, allowed))}", key=name
            )
    for name, allowed in LIST_CHOICES.items():
        section, key = name.split(".")
        values = getattr(getattr(cfg, section), key)
        unknown = [v for v in values if v not in allowed]
        if unknown or len(set(values)) != len(values):
            what = f"{unknown[0]!r} is not one of {', '.join(allowed)}" if unknown else "names one twice"
            raise ConfigError(f"{name}={','.join(values)}: {what}", key=name)
    pattern = cfg.model.window_pattern
    if not pattern or set(pattern) - {"S", "L"}:
        raise ConfigError(
            f"model.window_pattern={pattern!r} is not a pattern of S (a sliding window) and L (the whole "
            "sequence); use L, or nanochat's SSSL",
            key="model.window_pattern",
        )
    for part in PART_SECTIONS:
        part.check(getattr(cfg, part.NAME))
    if not (Path(__file__).resolve().parents[1] / "models" / cfg.model.arch / "descriptor.py").is_file():
        from .optional_parts import without_family

        absent = without_family(cfg.model.arch)  # a family the template offers (others: the rules' line)
        if absent:
            raise absent


def changed(cfg: Config, **changes) -> Config:
    """A copy of cfg with dotted keys set: changed(cfg, **{"batch.micro_batch_size": 4})."""
    new = copy.deepcopy(cfg)
    for key, value in changes.items():
        section, name = key.split(".")
        setattr(getattr(new, section), name, value)
    return new
