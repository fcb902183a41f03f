"""schedule.epochs (passes over the prepared train split) and schedule.tokens_per_param (tokens as a
multiple of the model's parameters): the run's length turned into the max_steps everything else
reads (learning-rate schedule, progress, evaluation and checkpoint cadence, plan). No torch.

    cfg = with_derived_steps(cfg, Path(cfg.data.dir))  # max_steps filled (cfg as it is under max_steps)
    print(derived_steps_line(cfg, Path(cfg.data.dir)))  # what train start prints of the derivation
    cfg, line = steps_where_known(cfg, data_dir)        # plan, check: before prepare-data, a line instead

tokens_per_param needs no data: max_steps = ceil(ratio x the family's scaling parameters / tokens
per step), so the token budget follows the model's size and the batch (`copier update --data
nodes=N` keeps it).

An epoch is every sequence training reads from the train split once: each shard cut into
model.sequence_len windows as the family reads them (tokens.sequences_in_shard), or its rows of
documents under data.rows=documents (document_rows.py). Steps are rounded up,
max_steps = ceil(train sequences x epochs / global batch), so every sequence is seen at least
`epochs` times (fractional epochs, 0.5, take a share of the split); the last step may read the
first sequences of the next pass. The count comes from meta.json's shard sizes, which the data's
fingerprint covers: a resume, which must be on the same data, derives the same steps.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

from ..models.family import family
from ..settings.config import Config, ConfigError, changed


def train_sequences(cfg: Config, data_dir: Path) -> int:
    """Sequences of one epoch of the prepared train split in data_dir, read as cfg's model reads them."""
    from .tokens import read_meta, sequences_in_shard  # numpy: only for epochs (plan and check run without it)

    causal = family(cfg.model.arch).causal
    if causal and cfg.data.rows == "documents":
        from .document_rows import DocumentRows

        return DocumentRows.open(data_dir, "train", cfg.model.sequence_len).num_sequences
    return sum(
        sequences_in_shard(shard["tokens"], cfg.model.sequence_len, causal) for shard in read_meta(data_dir)["train"]
    )


def scaling_params(cfg: Config) -> int:
    """The parameters schedule.tokens_per_param multiplies (the family's count)."""
    m = cfg.model
    fam = family(m.arch)
    return fam.scaling_params(fam.shape(m.size, m.n_kv_head, m), cfg.data.vocab_size, m.sequence_len)


def budget_steps(cfg: Config) -> int:
    """max_steps of schedule.tokens_per_param: at least that many tokens."""
    tokens_per_step = cfg.batch.global_batch_size * cfg.model.sequence_len
    return math.ceil(Fraction(str(cfg.schedule.tokens_per_param)) * scaling_params(cfg) / tokens_per_step)


def with_derived_steps(cfg: Config, data_dir: Path) -> Config:
    """cfg with schedule.max_steps derived from schedule.epochs and the prepared train split, or from
    schedule.tokens_per_param (cfg itself when max_steps gives the length). cfg's global batch is the
    one the run trains with (at_world_size)."""
    s = cfg.schedule
    problem = s.length_problem()
    if problem:
        raise ConfigError(problem, key="schedule.epochs")
    if s.tokens_per_param is not None:
        steps = budget_steps(cfg)
        if s.warmup_steps > steps:
            raise ConfigError(
                f"schedule.warmup_steps={s.warmup_steps} exceeds the {steps} steps schedule.tokens_per_param="
                f"{s.tokens_per_param:g} gives; lower the warmup or raise the ratio",
                key="schedule.warmup_steps",
            )
        return changed(cfg, **{"schedule.max_steps": steps})
    if s.epochs is None:
        return cfg
    sequences = train_sequences(cfg, data_dir)
    if sequences == 0:
        raise ConfigError(
            f"schedule.epochs={s.epochs:g}: the train split in {data_dir} holds no sequence of "
            f"model.sequence_len={cfg.model.sequence_len} tokens; add data or lower model.sequence_len",
            key="schedule.epochs",
        )
    # Exact arithmetic on the epochs as written: 0.1 x 2560 / 256 is one step, not 1.0000000000000002.
    steps = math.ceil(Fraction(str(s.epochs)) * sequences / cfg.batch.global_batch_size)
    if s.warmup_steps > steps:
        raise ConfigError(
            f"schedule.warmup_steps={s.warmup_steps} exceeds the {steps} steps schedule.epochs={s.epochs:g} gives "
            f"({sequences} train sequences, global batch {cfg.batch.global_batch_size}); lower the warmup",
            key="schedule.warmup_steps",
        )
    return changed(cfg, **{"schedule.max_steps": steps})


def derived_steps_line(cfg: Config, data_dir: Path) -> str | None:
    """How a config resolved by with_derived_steps got its max_steps, in one line (None: as written)."""
    s = cfg.schedule
    if s.tokens_per_param is not None:
        tokens_per_step = cfg.batch.global_batch_size * cfg.model.sequence_len
        return (
            f"schedule.tokens_per_param={s.tokens_per_param:g}: {s.max_steps} steps = ceil({s.tokens_per_param:g} x "
            f"{scaling_params(cfg):,} parameters / {tokens_per_step:,} tokens a step)"
        )
    if s.epochs is None:
        return None
    return (
        f"schedule.epochs={s.epochs:g}: {s.max_steps} steps = ceil({train_sequences(cfg, data_dir)} train sequences "
        f"x {s.epochs:g} / global batch {cfg.batch.global_batch_size})"
    )


def steps_where_known(cfg: Config, data_dir: Path) -> tuple[Config, str | None]:
    """For plan and check, which may run before prepare-data: with_derived_steps and its line once the
    data is prepared; before, cfg as it is (max_steps null) and a line saying where the steps come from."""
    if cfg.schedule.epochs is not None and cfg.schedule.max_steps is None:
        from .tokens import META  # numpy: only for a config that trains in epochs

        if not (Path(data_dir) / META).is_file():
            return cfg, (
                f"schedule.epochs={cfg.schedule.epochs:g}: the steps are derived from the prepared train split "
                f"(data.dir={cfg.data.dir}) after prepare-data"
            )
    cfg = with_derived_steps(cfg, data_dir)
    return cfg, derived_steps_line(cfg, data_dir)
