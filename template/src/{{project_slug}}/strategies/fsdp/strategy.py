"""FSDP2 strategy: torch's fully_shard on every repeated block (the members of the model's
ModuleLists: gpt's and gpt3's blocks, bert's encoder layers) and then on the whole model, so each
block's weights are gathered just before it runs and its gradients reduce-scattered as soon as its
backward ends. Weights, gradients and optimizer state stay sharded (DTensors, rows split over the
ranks) between steps.

- Precision: under bf16 the blocks gather their weights in bf16 (what autocast would cast them to)
  and every gradient is reduced in fp32, the sharded fp32 weights being the master copy; the
  embeddings, head and scalars stay fp32 and the loop's autocast keeps the float32 ops (norms, the
  loss) where DDP has them: a bf16 step computes what DDP's does but for the blocks' gradients,
  which are bf16 (as their gathered weights) until the fp32 reduction.
- Compile (CUDA, run.compile): each block compiled on its own before it is sharded, the collectives
  outside the graphs: two graphs whatever the depth (the first block's, then one the others share once
  dynamo makes the layer number a variable), no graph break (tests/test_fsdp.py, Inductor on a CPU).
- Optimizer: optimizer.py's, on the sharded parameters. AdamW steps each rank's rows; Muon gathers each
  matrix whole for its orthogonalisation (the same algorithm as under DDP) and each rank updates the
  rows it holds.
- Checkpoints: sharded_checkpoint.py (torch.distributed.checkpoint: one folder of shards, read on any world size).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from ...runtime import process_exit
from ...runtime.run_context import Run
from ..common import compiled, norm_dtype, skip_step
from ..optimizer import build_optimizer, groups_line, held_rows, peak_lrs, set_schedule
from . import sharded_checkpoint


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated layers: every member of its ModuleLists (the unit FSDP gathers at once)."""
    return [block for module in model.modules() if isinstance(module, torch.nn.ModuleList) for block in module]


def separate_tables(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The embedding tables sharded as units of their own: those the model names as only ever looked
    up through their module (its `lookup_tables()`: no head tied to them, no weight read directly)
    that are at least as large as a block. Gathered only while looked up, they do not sit whole
    beside the blocks for the whole step (gpt's token and value-embedding tables: most of its
    parameters outside the blocks)."""
    blocks = repeated_blocks(model)
    if not blocks or not hasattr(model, "lookup_tables"):
        return []
    block_size = max(sum(p.numel() for p in block.parameters()) for block in blocks)
    return [table for table in model.lookup_tables() if table.weight.numel() >= block_size]


def shard_model(
    model: torch.nn.Module, mesh, bf16: bool, offload: bool, reshard_after_forward: bool, compile_blocks: bool
) -> None:
    """fully_shard every repeated block (compiled first where asked, the gathers and reductions
    outside its graph), the large embedding tables (separate_tables), and then the model (the head
    and scalars, gathered once per forward). bf16: the blocks gather their weights in bf16; the
    tables and the model's own tensors stay fp32, so the residual stream and the scalars that scale
    it are fp32 as under DDP's autocast. Gradients are reduced in fp32."""
    precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    full = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    options = {"mesh": mesh, "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy()}
    for block in repeated_blocks(model):
        if compile_blocks:
            block.compile()
        fully_shard(block, reshard_after_forward=reshard_after_forward, mp_policy=precision, **options)
    for table in separate_tables(model):
        fully_shard(table, reshard_after_forward=True, mp_policy=full, **options)
    fully_shard(model, mp_policy=full, **options)


class FSDPStrategy:  # implements base.Strategy
    name = "fsdp"
    consumes_batches = False

    def __init__(self, run: Run, model: torch.nn.Module, resume: bool = False):  # resume: loaded by resume()
        cfg = run.cfg
        self.cfg, self.run, self.accum = cfg, run, run.grad_accum
        self.data_rank = run.rank  # every rank is a data-parallel rank
        self.num_params, self.flops_per_token = model.num_params(), model.flops_per_token()
        self.resumed_state = {}
        self.run_id = None  # set by resume: the resumed checkpoint's run, or a new one
        self.compiled, self.compile_note = compiled(cfg.run, run.device)
        if not dist.is_initialized():  # one process started without torchrun: a group of one, in memory
            backend = "nccl" if run.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            process_exit.joined_group(dist.group.WORLD)
        # On a CPU the weights are in host memory already: offload has nothing to move (and needs a GPU).
        self.offloaded = cfg.fsdp.offload and run.device.type != "cpu"
        shard_model(
            model,
            init_device_mesh(run.device.type, (run.world_size,)),
            bf16=run.precision == "bf16",
            offload=self.offloaded,
            reshard_after_forward=cfg.fsdp.reshard_after_forward,
            compile_blocks=self.compiled,
        )
        self.module = self.runnable = model
        self.optimizer = build_optimizer(model, run)
        peaks = peak_lrs(self.optimizer)
        self.peak_lr = peaks.get("muon", peaks.get("adamw"))

    def describe(self) -> str:
        reshard = "" if self.cfg.fsdp.reshard_after_forward else ", weights kept from forward to backward"
        offload = ", offloaded to CPU" if self.offloaded else ""
        if self.cfg.fsdp.offload and not self.offloaded:
            offload = ", fsdp.offload does nothing on a CPU"
        muon = f", {groups_line(self.optimizer)}" if self.cfg.optim.optimizer == "muon" else ""
        return f"strategy fsdp (FSDP2{reshard}{offload}), {self.compile_note}{muon}"

    def set_schedule(self, point) -> None:
        set_schedule(self.optimizer, point)

    def micro_context(self, micro: int):
        """Gradients are reduce-scattered only on the last micro step of the accumulation."""
        self.module.set_requires_gradient_sync(micro == self.accum - 1)
        return nullcontext()

    def backward(self, loss: torch.Tensor, micro: int) -> None:
        (loss / self.accum).backward()

    def step(self, judge) -> torch.Tensor:
        """Clip by the global norm over every rank's shards, update unless judge(norm) says not to,
        clear; returns the norm before clipping."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        grads = [held_rows(p.grad) for p in params]
        device = self.run.device
        squares = torch.zeros((), dtype=norm_dtype(device), device=device)
        if grads:
            norms = torch._foreach_norm(grads, 2, dtype=norm_dtype(device))
            squares = torch.stack([n.to(device) for n in norms]).square().sum()
        if dist.is_initialized():
            dist.all_reduce(squares)
        grad_norm = squares.sqrt().float()
        max_norm = self.cfg.optim.grad_clip
        if max_norm and grads:
            factor = (max_norm / (grad_norm + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_(grads, factor.to(grads[0].device))
        skip_step(self.optimizer, judge(grad_norm), self.optimizer.step)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def local_weights(self) -> list[torch.Tensor]:
        """The shards of the weights this rank holds."""
        return [held_rows(p.detach()) for p in self.module.parameters()]

    def loss_scaling(self) -> dict:
        return {}

    def save(self, ckpt_dir: Path, step: int, extra: dict) -> None:
        sharded_checkpoint.save(self, ckpt_dir, step, extra)

    def resume(self, ckpt_dir: Path, allowed: bool) -> int:
        return sharded_checkpoint.resume(self, ckpt_dir, allowed)
