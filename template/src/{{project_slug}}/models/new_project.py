"""What copier asks and writes for a new project of a model family (no torch): the questions'
defaults, the starting recipe, config/train.yaml's lines for the family and the README's words.

copier reads these through hooks/answers.py (Family inherits them: a descriptor sets the fields
and overrides config_settings where its train.yaml differs); `check` reads config_settings too, to
know which model.* settings a family reads (planning/rules.py family_settings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# schedule's other ways to say how long, commented out in a new project's train.yaml.
LENGTH_ALTERNATIVES = [
    (None, "", "epochs: 3            # instead of max_steps (set it to null): steps = ceil(train sequences x epochs / global batch), printed at train start"),
    (None, "", "tokens_per_param: 20 # or instead: steps = ceil(ratio x the model's parameters / tokens a step), printed at train start and by plan"),
]  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class NewProject:
    """A family's answers for copier. sizes is Family's (the model's shapes by name)."""

    presets: dict[str, dict[str, Any]] = field(default_factory=dict)  # named sizes with a cluster layout
    # The starting recipe copier writes into train.yaml (global and micro batch in sequences, peak lr,
    # sequence length, nominal parameters for the step budget), and what a size changes of it.
    recipe_defaults: dict[str, Any] = field(
        default_factory=lambda: {"global_batch": 256, "micro_batch": 16, "lr": 3e-4, "sequence_len": 2048}
    )
    recipe_by_size: dict[str, dict[str, Any]] = field(default_factory=dict)
    title: str = ""  # the README's "A <title> trained with ...": {size} is the size answer
    default_size: str = ""  # model_size's default (a preset's size, for a family with presets)
    default_strategy: str = "ddp"  # the strategy question's default (one the template offers)
    gpu_type: str = "h100-80gb"  # gpu_type's default (a preset names its own)
    recipes: tuple[str, ...] = ()  # gpt_recipe's choices, for a family with more than one recipe
    vocab_size: int = 32768  # data.vocab_size: the tokenizer prepare-data trains
    vocab_note: str = ""  # why that size, in train.yaml's comment
    exports_own_code: bool = False  # `export` may write the model's own modeling code (trust_remote_code)
    weight_decay: float = 0.1  # AdamW's, in a new project's train.yaml
    beta2: float = 0.95

    def recipe(self, size: str) -> dict[str, Any]:
        """global_batch, micro_batch, lr, sequence_len (and nominal params where known) for a size."""
        return {**self.recipe_defaults, **self.recipe_by_size.get(size, {})}

    def size_names(self) -> str:
        """The sizes a user may write in model.size, as the copier question's help lists them."""
        return ", ".join(self.sizes)

    def config_settings(self, section: str, answers: dict) -> list[tuple[str | None, Any, str]]:
        """The family's lines of config/train.yaml's `section` (model, data, optim, schedule) for copier's
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
                ("grad_clip", 1.0, "global gradient norm; 0 disables"),
            ]
        if section == "data":
            return []  # the token stream's windows (settings/config.py DataConfig.rows), or the family's own batches
        if section == "schedule":
            return [
                ("max_steps", 20000, ""),
                *LENGTH_ALTERNATIVES,
                ("warmup_steps", 500, ""),
                ("decay", "cosine", "cosine to lr * min_lr_ratio | warmdown: constant, then linear over the last warmdown_ratio of the steps"),
                ("min_lr_ratio", 0.1, "cosine decays to lr * min_lr_ratio"),
            ]  # fmt: skip
        raise ValueError(f"no train.yaml section {section!r} of a family")
