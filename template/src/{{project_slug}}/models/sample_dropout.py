"""Dropout whose masks follow the sample, not the process that computes it.

    with samples(sample_keys(seed, step, first, count, device)):   # train.py, around a micro batch
        loss = model(x, y)
        loss.backward()
    h = keyed_dropout(h, p, layer=3, training=self.training)       # in a model

torch's dropout draws from the process's generator: a micro batch's masks depend on which rank runs
it and on how many it ran before, so 1 and 2 processes give different losses, and data-parallel
ranks seeded alike draw the same masks for different samples (correlated noise, weaker
regularisation). Here whether an element is dropped is a hash of (run.seed, global step, the
sample's global index in the data stream, the layer, the element's position in the whole, unsplit
activation). That is the same on any number of processes, any data/tensor/pipeline layout and any
sharding of the model states, after a resume on another data-parallel size, and again when
activation checkpointing recomputes a block (no generator state to save or restore). Tensor-parallel
ranks draw the same mask for a replicated activation and different ones for their slices of a split
one (`split`), as tensor-parallel trainers' RNG trackers arrange.

The hash is a 32-bit integer mix on int64 tensors (constants below 2^27, so no product overflows).
On a GPU it runs as one kernel per site, like torch's dropout: the mask is an op of its own
(`<module>::keyed_dropout`, torch.library) whose CUDA implementation is the hash compiled into one
fused kernel that reads x and writes the result (torch's also writes a byte mask); its backward is
the same op on the gradient (the mask is drawn again, not stored). Inside a compiled model the
plain tensor expression is traced instead, and Inductor fuses it with its neighbours. On the CPU
the op runs the expression eagerly (~30 int64 element-wise ops; the CPU is for tests). The keys are
a module variable, not a context variable: CUDA runs backward, and so the recomputation of
checkpointed blocks, on another thread.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn

_MASK = 0xFFFFFFFF
_MULTIPLIER = 0x45D9F3B  # a well-known 32-bit mixing constant; < 2^27 keeps x * it below 2^59
_keys: torch.Tensor | None = None
"""One key per sample of the micro batch being computed (B,), set by samples()."""


def _mix(x):
    """A 32-bit integer hash (values in [0, 2^32) in and out): for int tensors and Python ints alike."""
    x = x ^ (x >> 16)
    x = (x * _MULTIPLIER) & _MASK
    x = x ^ (x >> 16)
    x = (x * _MULTIPLIER) & _MASK
    return x ^ (x >> 16)


def sample_keys(seed: int, step: int, first: int, count: int, device=None) -> torch.Tensor:
    """Keys of sequences first .. first+count-1 of the stream at a step: (count,) int64."""
    base = _mix(_mix(seed & _MASK) ^ (step & _MASK))
    index = torch.arange(first, first + count, dtype=torch.int64, device=device)
    return _mix(_mix(index & _MASK ^ base) ^ (index >> 32))


@contextmanager
def samples(keys: torch.Tensor | None) -> Iterator[None]:
    """Dropout in this block (forward, and backward's recomputation) draws for these samples."""
    global _keys
    previous, _keys = _keys, keys
    try:
        yield
    finally:
        _keys = previous


def _layer_key(layer: int | torch.Tensor) -> int | torch.Tensor:
    return _mix((layer + 0x9E3779B9) & _MASK)


def _flat_positions(sample_shape: torch.Size, split: tuple[int, int, int] | None, device) -> torch.Tensor:
    """The flat index of every element of one sample's activation (shape without the batch dimension)
    within the whole, unsplit activation; split = (dim, offset, whole size) for a slice along dim."""
    index = torch.arange(sample_shape.numel(), dtype=torch.int64, device=device).view(sample_shape)
    if split is None:
        return index
    dim, offset, whole = split[0] - 1, split[1], split[2]
    inner = sample_shape[dim + 1 :].numel()
    local = sample_shape[dim]
    outer, along = index // (inner * local), (index // inner) % local
    return outer * (whole * inner) + (along + offset) * inner + index % inner


def _dropped(
    x: torch.Tensor, keys: torch.Tensor, layer_key: int, threshold: int, scale: float, split: tuple | None
) -> torch.Tensor:
    """x times its keep mask and 1/(1-p): the plain tensor expression (the op and compiled models run it)."""
    drawn = _mix(
        _mix(_flat_positions(x.shape[1:], split, x.device) & _MASK)
        ^ _mix(keys ^ layer_key).view(-1, *([1] * (x.dim() - 1)))
    )
    return x * (drawn >= threshold).to(x.dtype) * scale


@functools.cache
def _fused():
    """The expression compiled into one kernel for CUDA (once per process; shapes stay dynamic)."""
    return torch.compile(_dropped, dynamic=True, fullgraph=True)


# Named after this module's full name: an exported model's copy of this file (gpt/export.py)
# registers its own op beside the package's, one per export folder loaded.
_OP_NAMESPACE = re.sub(r"\W", "_", __name__)


@torch.library.custom_op(f"{_OP_NAMESPACE}::keyed_dropout", mutates_args=())
def _keyed_dropout_op(
    x: torch.Tensor, keys: torch.Tensor, layer_key: int, threshold: int, scale: float, split: list[int]
) -> torch.Tensor:
    run = _fused() if x.is_cuda else _dropped
    return run(x, keys, layer_key, threshold, scale, tuple(split) or None)


@_keyed_dropout_op.register_fake
def _(x, keys, layer_key, threshold, scale, split):
    return torch.empty_like(x)


def _save_keys(ctx, inputs, output):
    x, keys, *ctx.draw = inputs
    ctx.save_for_backward(keys)


def _backward(ctx, grad):
    (keys,) = ctx.saved_tensors
    return _keyed_dropout_op(grad, keys, *ctx.draw), None, None, None, None, None


_keyed_dropout_op.register_autograd(_backward, setup_context=_save_keys)


def keyed_dropout(
    x: torch.Tensor, p: float, layer: int | torch.Tensor, training: bool, split: tuple[int, int, int] | None = None
) -> torch.Tensor:
    """Dropout of x (batch first) with masks keyed by each sample and `layer` (unique in the model; an
    int, or a 0-dim int64 tensor on x's device that a graph reads rather than specialises on).
    split = (dim, offset, whole size): x is a slice of a larger activation along dim (tensor
    parallel), starting at offset."""
    if not training or p == 0:
        return x
    keys = _keys
    if keys is None or keys.size(0) != x.size(0):
        raise RuntimeError(
            f"dropout (p={p}) ran in training mode outside samples(...) for its {x.size(0)} samples: "
            "wrap the forward and backward of each micro batch in models.sample_dropout.samples(sample_keys(...))"
        )
    keys, layer_key = keys.to(x.device), _layer_key(layer)
    if isinstance(layer_key, torch.Tensor):  # a layer's key held as data: mixed in here, the same draw
        keys, layer_key = keys ^ layer_key, 0
    draw = (layer_key, int(p * 2**32), 1.0 / (1.0 - p))
    if torch.compiler.is_compiling():  # traced into the model's graph: fused with what surrounds it
        return _dropped(x, keys, *draw, split)
    return _keyed_dropout_op(x, keys, *draw, list(split or ()))


class KeyedDropout(nn.Dropout):
    """nn.Dropout drawing through keyed_dropout (`p` stays readable, as libraries expect)."""

    def __init__(self, p: float, layer: int):
        super().__init__(p)
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return keyed_dropout(x, self.p, self.layer, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, layer={self.layer}"
