"""Which of nanochat's pieces a GPT has and what they add: the network (gpt/model.py) builds them, the
family's formulas (gpt/descriptor.py) count them. Plain Python, no package imports: gpt/model.py and this file travel into an
export's folder as its modeling code (gpt/export.py)."""

from __future__ import annotations

# Switches of model.* that add parameters, carried in a shape for the formulas.
PIECES = ("value_embeddings", "residual_scalars", "smear", "backout")
SWITCHES = (
    *PIECES,
    "qk_scale",
    "rotary_base",
    "init",
    "window_pattern",
    "vocab_multiple",
)  # every model.* switch the network takes
SHAPED = (*PIECES, "window_pattern", "vocab_multiple")  # the switches a shape carries for the formulas
VALUE_GATE_CHANNELS = 12  # the leading channels of a layer's input that gate its value embedding
SMEAR_GATE_CHANNELS = 24  # those of a token's embedding that gate how much of the previous one it takes


def has_value_embedding(layer: int, n_layer: int) -> bool:
    """Alternating layers, the last one always among them."""
    return layer % 2 == (n_layer - 1) % 2


def attention_windows(pattern: str, n_layer: int, sequence_len: int) -> list[int]:
    """How many earlier positions each layer's queries see: the pattern's letters tiled over the
    layers, S a short window (a quarter of the sequence; above 128, rounded up to a multiple of 128,
    the kernels' tile), L the whole sequence; the last layer always sees the whole."""
    quarter = max(1, sequence_len // 4)
    short = quarter if quarter <= 128 else -(-quarter // 128) * 128
    windows = [short if pattern[i % len(pattern)] == "S" else sequence_len for i in range(n_layer)]
    windows[-1] = sequence_len
    return windows


def padded_vocab(vocab_size: int, multiple: int) -> int:
    """Rows of the embedding, value-embedding and head tables: the vocabulary rounded up to a multiple
    (64 keeps the head's matmul on the GPU's tiles); the logits past the vocabulary are cut off."""
    return -(-vocab_size // multiple) * multiple


def has_backout(backout: bool, n_layer: int) -> bool:
    """model.backout where the middle layer is not the last: taken from the last layer's output, the
    share would vanish in the final norm (a parameter without effect)."""
    return backout and n_layer // 2 < n_layer - 1


# What the pieces add to a shape ({"n_layer", "n_embd", "n_head", "n_kv_head"} and the PIECES switches).


def value_layers(shape: dict) -> int:
    L = shape["n_layer"]
    return sum(has_value_embedding(i, L) for i in range(L)) if shape.get("value_embeddings") else 0


def value_tables(shape: dict, rows: int) -> int:
    """The value embeddings' tables of `rows` rows (lookups, like the token embedding)."""
    return value_layers(shape) * rows * shape["n_kv_head"] * (shape["n_embd"] // shape["n_head"])


def smear_gate(shape: dict) -> int:
    return SMEAR_GATE_CHANNELS if shape.get("smear") else 0


def gates(shape: dict) -> int:
    """The value embeddings' gates (a small matrix per layer that has one) and smear's gate: matmuls."""
    return value_layers(shape) * VALUE_GATE_CHANNELS * shape["n_kv_head"] + smear_gate(shape)


def optimizer_roles(shape: dict) -> set[str]:
    """The parameter roles (gpt/model.py param_roles) the shape has parameters for."""
    roles = {"matrix", "embedding", "unembedding"}
    roles |= {"value_embedding"} if value_layers(shape) else set()
    roles |= {"residual_scalar", "x0_scalar"} if shape.get("residual_scalars") else set()
    gated = shape.get("smear") or has_backout(bool(shape.get("backout")), shape["n_layer"])
    return roles | ({"gate_scalar"} if gated else set())


def scalars(shape: dict) -> int:
    """The residual and input-embedding scales per layer, smear's and backout's shares."""
    return (
        2 * shape["n_layer"] * bool(shape.get("residual_scalars"))
        + bool(shape.get("smear"))
        + has_backout(bool(shape.get("backout")), shape["n_layer"])
    )
