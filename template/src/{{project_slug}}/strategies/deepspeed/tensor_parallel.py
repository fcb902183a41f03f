"""Tensor parallelism (parallel.tensor > 1): a built block's Linear layers replaced by shards.

Megatron's split, with the layer names the family's pipeline hook gives (gpt3: qkv and fc by output
features, column parallel; proj and fc2 by input features, row parallel, whose partial outputs are
all-reduced), so each sublayer costs one all-reduce in forward and one in backward. The shards are DeepSpeed's tensor-parallel layers
(module_inject.layers.LinearLayer = column, LinearAllreduce = row). Why these and not
torch.distributed.tensor: their weights are plain tensors, so DeepSpeed's pipeline engine, ZeRO 1-2
optimizer and checkpoints handle them unchanged; DTensor parameters are understood by neither.
Embeddings and head stay replicated (no vocabulary-parallel split): simpler, at the cost of V x h
weights on every tensor rank.

A Block is built whole under its layer's seed and sliced afterwards, so every layout starts from
the weights one process would have.
"""

from __future__ import annotations

import torch
from torch import nn


def parallelize_block(block: nn.Module, group, split) -> nn.Module:
    """Shard the block's matrices over the tensor-parallel `group` in place (None: leave it whole):
    split.column_parallel's weight rows and bias, split.row_parallel's weight columns (the bias is
    added once, after the all-reduce). The block's n_head and head_offset say which heads it computes."""
    if group is None:
        return block
    from deepspeed.module_inject.layers import LinearAllreduce, LinearLayer, set_autotp_mode

    set_autotp_mode(training=True)  # all-reduces with autograd, not the inference shortcut
    for name in split.column_parallel:
        setattr(block, name, LinearLayer(getattr(block, name), mp_group=group))
    for name in split.row_parallel:
        setattr(block, name, LinearAllreduce(getattr(block, name), mp_group=group))
    # Contiguous rows of qkv are whole heads: this rank computes heads offset .. offset + n/size - 1,
    # and keys their attention dropout by those numbers (other ranks' heads get other masks).
    size = torch.distributed.get_world_size(group)
    block.head_offset = torch.distributed.get_rank(group) * block.n_head // size
    return block


def join_shards(name: str, shards: list[torch.Tensor], split) -> torch.Tensor:
    """One block tensor (`name` as in the block's state dict, e.g. 'qkv.weight') from every
    tensor rank's shard, in rank order."""
    layer, _, kind = name.rpartition(".")
    if layer in split.column_parallel:
        return torch.cat(shards, dim=0)
    if layer in split.row_parallel and kind == "weight":
        return torch.cat(shards, dim=1)
    return shards[0]  # replicated: norms and row-parallel biases
