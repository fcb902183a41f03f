"""A GPT with nanochat's later pieces as a transformers model: the modeling code an export carries.

transformers' NanoChatForCausalLM holds the plain GPT (gpt/build.py to_transformers converts to it);
value embeddings, residual scalars, smear, backout, a q/k scale and sliding windows have no
place there. Such a model
is exported as GPTForCausalLM below: save_pretrained writes this file and the ones it imports
(model.py, pieces.py, and the shared lm_loss.py, loss_chunks.py and sample_dropout.py: torch only) flat into the
folder and names them in config.json's auto_map, so any tool loads the folder offline with

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

and computes with the very network that trained. No KV cache here: generate() re-reads the whole
context each token (our `sample` keeps one).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .model import GPT, GPTConfig

HERE = Path(__file__).resolve().parent
# The files the exported model computes with, flat in the folder: the family's and the shared ones.
MODELING_FILES = (HERE / "export.py", HERE / "model.py", HERE / "pieces.py", HERE.parent / "lm_loss.py",
                  HERE.parent / "loss_chunks.py", HERE.parent / "sample_dropout.py")  # fmt: skip
AUTO_MAP = {"AutoConfig": "export.GPTPiecesConfig", "AutoModelForCausalLM": "export.GPTForCausalLM"}


class GPTPiecesConfig(PretrainedConfig):
    model_type = "nanochat_pieces_gpt"

    def __init__(self, gpt: dict | None = None, **kwargs):
        self.gpt = dict(gpt or {})  # GPTConfig's fields
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)


class GPTForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = GPTPiecesConfig
    base_model_prefix = "gpt"
    main_input_name = "input_ids"
    _supports_cache_class = False

    def __init__(self, config: GPTPiecesConfig):
        super().__init__(config)
        self.gpt = GPT(GPTConfig(**config.gpt))
        self.post_init()

    def save_pretrained(self, save_directory, **kwargs):
        """The weights and config, then the modeling code beside them (transformers' own copy follows
        single-dot imports only, and these files import their family's shared modules with two)."""
        super().save_pretrained(save_directory, **kwargs)
        write_modeling_code(Path(save_directory))

    def _init_weights(self, module):
        """The weights come from the folder; the rotary tables are not in it (made again here)."""
        if isinstance(module, GPT):
            module.init_rotary()

    def get_input_embeddings(self):
        return self.gpt.wte

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def forward(self, input_ids: torch.Tensor, attention_mask=None, labels=None, **unused) -> CausalLMOutput:
        # Padding at a row's end is harmless to a causal model (no position sees a later one); at its
        # start it would shift the positions and be attended to.
        if attention_mask is not None and bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()):
            raise ValueError("this model reads rows padded at the end only (tokenizer.padding_side='right')")
        logits = self.gpt(input_ids)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids[:, -self.gpt.config.sequence_len :]}


def write_modeling_code(folder: Path) -> None:
    """MODELING_FILES into `folder`, each import of a sibling made a one-dot import, and config.json's
    auto_map naming the classes (AutoModelForCausalLM with trust_remote_code loads them)."""
    for source in MODELING_FILES:
        text = re.sub(r"^(\s*)from \.\.+(\w)", r"\1from .\2", source.read_text(), flags=re.M)
        (folder / source.name).write_text(text)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "auto_map": AUTO_MAP}, indent=2, sort_keys=True) + "\n")


def from_gpt(model: GPT) -> GPTForCausalLM:
    """Our trained GPT as GPTForCausalLM (same weights, fp32, eval); save_pretrained writes the
    modeling files beside the weights."""
    c = model.config
    config = GPTPiecesConfig(
        gpt={**dataclasses.asdict(c), "dropout": 0.0},
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        max_position_embeddings=c.sequence_len,
    )
    hf = GPTForCausalLM(config)
    hf.gpt.load_state_dict(model.state_dict(), strict=True)
    return hf.eval()
