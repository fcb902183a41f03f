"""What planning prices of a model family (no torch): parameters, FLOPs, activation and loss bytes.

A family's descriptor class overrides these (Family inherits them); `plan`, `check` and fit read
them through planning/estimates.py, and the family's nn.Module reports the same counts (its tests
hold them equal). The formulas take a shape (Family.shape(size)), the vocabulary size V and the
sequence length T; memory formulas count bytes. Below them, the pieces families of standard
transformer blocks share.
"""

from __future__ import annotations


class Costs:
    """The formulas of a family; num_params, flops_per_token and layer_activations have no default."""

    def num_params(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        raise NotImplementedError(f"{self.name}: num_params")

    def flops_per_token(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        raise NotImplementedError(f"{self.name}: flops_per_token")

    def largest_layer_params(self, shape: dict, vocab_size: int) -> int:
        """The largest module's own parameters: what a strategy that shards the weights gathers at once."""
        return max(vocab_size * shape["n_embd"], 4 * shape["n_embd"] ** 2)

    def repeated_block_params(self, shape: dict, vocab_size: int) -> int:
        """Parameters of the largest of the model's repeated blocks (the members of its block list):
        the unit a strategy that shards per block gathers at once. The model's own tensors
        (embeddings, head, final norm) are about num_params minus n_layer of these."""
        return block_params(shape["n_embd"])

    def lookup_tables(self, shape: dict, vocab_size: int) -> list[int]:
        """The sizes of the tables the model's lookup_tables() names: outside the blocks, only ever
        read by a lookup (no head tied to them), so a strategy may shard each as a unit of its own."""
        return []

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
        chunked: the model computes its training loss chunk by chunk where it can (models/lm_loss.py;
        not under a pipeline engine, whose loss function is given the whole logits); a family that
        does not holds the whole logits either way."""
        return tokens * vocab_size * self.logits_bytes(softcap)

    def scaling_params(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        """The parameters whose multiple is the compute-optimal number of tokens
        (schedule.tokens_per_param): every parameter, as Chinchilla counted."""
        return self.num_params(shape, vocab_size, sequence_len)

    def muon_params(self, shape: dict, vocab_size: int) -> int:
        """Parameters Muon steps under optim.optimizer=muon (none where the family has no roles)."""
        return 0


FORMULAS = ("num_params", "flops_per_token", "layer_activations")  # what every family defines itself


def block_params(h: int, tp: int = 1) -> int:
    """One standard transformer block (biased attention and 4h MLP, two LayerNorms) on one
    tensor-parallel rank: 12h^2 + 13h when tp = 1."""
    return (12 * h * h + 7 * h) // tp + 6 * h  # split: 4 matrices, qkv and fc biases; replicated: 2 biases, 2 norms


def stage_layers(n_layer: int, pp: int) -> list[int]:
    """Blocks per pipeline stage (equal when pp divides the layers, as the rules require)."""
    return [n_layer // pp + (1 if i < n_layer % pp else 0) for i in range(pp)]


def transformer_layer_activations(
    shape: dict, seq: int, micro: int, tp: int, replicated: float, scores_stored: bool
) -> float:
    """Korthikanti et al. 2022 for a standard transformer block, tensor degree t, no sequence
    parallelism: s*b*h*(replicated + 24/t) bytes (24/t: what the split heads and MLP keep; replicated:
    norms, block inputs, dropout masks: the paper's 10, measured per family and precision), plus
    5*a*s^2*b/t where the attention probabilities are stored. F.scaled_dot_product_attention's flash
    and memory-efficient kernels on a GPU keep no s x s matrix: that term counts only with
    model.attention_dropout > 0, when the probabilities are materialised so their masks can be keyed
    per sample (models/sample_dropout.py)."""
    scores = 5 * shape["n_head"] * seq * seq * micro / tp if scores_stored else 0
    return seq * micro * shape["n_embd"] * (replicated + 24 / tp) + scores
