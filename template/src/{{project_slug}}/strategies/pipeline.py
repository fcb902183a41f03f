"""Pipeline and tensor parallelism for model.arch=gpt3: DeepSpeed's PipelineModule + pipeline engine.

    <package> train parallel.pipeline=4 parallel.tensor=2      # world = data x 4 x 2

The world is a grid (DeepSpeed's PipeModelDataParallelTopology, axes pipe x data x model): ranks
next to each other share a tensor-parallel group (keep it inside a node), then data, then pipeline
stages. The layers (models/gpt3.py) are split over the stages by counting Blocks, each Block sharded
over its tensor-parallel group as it is built (strategies/tensor_parallel.py); the embedding
sits on the first stage and, tied, again on the last for the head (DeepSpeed all-reduces the two
copies' gradients). The engine runs all micro batches of a step itself (1F1B schedule), so
train.py hands it the step's micro batches at once (consumes_batches). ZeRO stage 0 or 1 only:
DeepSpeed's pipeline engine refuses 2 and 3. Checkpoints, resume and the learning rate are the
DeepSpeed strategy's (one folder per step, a file per layer and tensor rank); read_checkpoint
joins those files into the one-process model's weights for eval and sample. The engine runs the
stages' modules in the run's 16-bit precision: bf16, or fp16 under DeepSpeed's dynamic loss scaler.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import torch
import torch.utils.checkpoint

from ..models.family import family
from ..models.gpt3 import GPT3, Block, Embedding, FinalNorm, gpt3_config, head_logits, lm_loss
from ..models.sample_dropout import samples
from ..runtime.distributed import DistInfo, resolve_precision
from ..settings.config import Config
from . import universal_checkpoint
from .common import clip_gradients, compiled, global_grad_norm, param_groups
from .deepspeed import (
    DeepSpeedStrategy,
    clipped_by_strategy,
    deepspeed_config,
    import_deepspeed,
    load_model_states,
    norm_tensor,
    refuse_unsupported_precision,
    trained_state,
)
from .tensor_parallel import join_shards, parallelize_block


def is_pipeline_checkpoint(folder: Path) -> bool:
    return any(Path(folder).glob("layer_*-model_states.pt"))


def read_checkpoint(folder: Path) -> dict:
    """A checkpoint folder this strategy wrote, for one process (eval, sample): train.py's client
    state with "model": the whole GPT3's weights in fp32."""
    states = load_model_states(folder)
    model = states["config"]["model"]
    n_layer = family(model["arch"]).shape(model["size"])["n_layer"]
    return trained_state(states, consolidated_weights(folder, n_layer))


def consolidated_weights(folder: Path, n_layer: int) -> dict:
    """GPT3's state dict from the files DeepSpeed writes per layer and tensor rank
    (layer_XX-model_YY-model_states.pt; layer 0 the embedding, 1..n_layer the blocks, n_layer+1
    the final norm, n_layer+2 the head's tied copy of the embedding, skipped)."""
    state: dict = {}
    for index in range(n_layer + 2):
        shards = sorted(Path(folder).glob(f"layer_{index:02d}-model_*-model_states.pt"))
        if not shards:
            raise FileNotFoundError(f"{folder} has no file for pipeline layer {index} (layer_{index:02d}-model_*)")
        parts = [torch.load(f, map_location="cpu", weights_only=True) for f in shards]
        prefix = "embed." if index == 0 else "norm." if index == n_layer + 1 else f"blocks.{index - 1}."
        for key, value in parts[0].items():
            is_block = 0 < index <= n_layer  # only blocks are tensor-parallel
            state[prefix + key] = join_shards(key, [p[key] for p in parts]) if is_block else value
    return state


# The stages pass (hidden states, dropout keys) along: a stage works on several micro batches in
# turn (1F1B), and each layer needs the keys of the samples in front of it (models/sample_dropout.py).
# The layers are gpt3's, with their weights and names; only forward's arguments differ.


class KeyedEmbedding(Embedding):
    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        idx, keys = inputs
        with samples(keys):
            return super().forward(idx), keys


class KeyedBlock(Block):
    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, keys = inputs
        with samples(keys):  # also when activation checkpointing recomputes the block in backward
            return super().forward(x), keys


class KeyedFinalNorm(FinalNorm):
    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return super().forward(inputs[0])


def layer_specs(cfg: Config, vocab_size: int, tp_group):
    """Embedding, blocks, final norm, tied head: the order (and seeds) of models.gpt3.GPT3."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    class ShardedBlockSpec(LayerSpec):
        """A Block built whole under its layer's seed, then sharded over the tensor-parallel group.
        partition_method finds it by its type's name (KeyedBlock)."""

        def build(self, log=False):
            return parallelize_block(super().build(log), tp_group)

    c = gpt3_config(cfg, vocab_size)
    return [
        TiedLayerSpec("embed", KeyedEmbedding, c, tied_weight_attr=["wte.weight"]),
        *[ShardedBlockSpec(KeyedBlock, c, i) for i in range(c.n_layer)],
        LayerSpec(KeyedFinalNorm, c.n_embd),
        TiedLayerSpec("embed", KeyedEmbedding, c, forward_fn=head_logits, tied_weight_attr=["wte.weight"]),
    ]


class PipelineStrategy(DeepSpeedStrategy):
    name = "pipeline"
    consumes_batches = True

    def __init__(self, cfg: Config, info: DistInfo, vocab_size: int, accum: int, resume: bool = False):
        deepspeed = import_deepspeed()
        from deepspeed.pipe import PipelineModule
        from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology

        self.cfg, self.info, self.accum = cfg, info, accum
        self._init_process_group(deepspeed)
        tp, pp = cfg.parallel.tensor, cfg.parallel.pipeline
        dp = cfg.data_parallel_size(info.world_size)
        self.ds_config = deepspeed_config(cfg, accum, dp, info.device)
        refuse_unsupported_precision(self.ds_config, info.device, cfg.run.dtype)
        self.find_resume_point(resume, dp)
        topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
        grid = PipelineParallelGrid(topology=topology)  # the tensor-parallel groups the blocks need now
        self.data_rank, self.data_parallel_size = grid.get_data_parallel_id(), dp
        with torch.device("meta"):  # sizes of the whole model, without allocating it
            whole = GPT3(gpt3_config(cfg, vocab_size))
        self.num_params, self.flops_per_token = whole.num_params(), whole.flops_per_token()
        # DeepSpeed broadcasts the tied embedding from its first stage to its last (in-place, as the
        # module is built and again after loading a checkpoint). Under grad mode autograd records it,
        # and every backward then warns that c10d::broadcast_ has no gradient: not needed, since the
        # copies' gradients are all-reduced separately. Without grad mode nothing is recorded.
        with torch.no_grad():
            module = PipelineModule(
                layers=layer_specs(cfg, vocab_size, grid.get_slice_parallel_group() if tp > 1 else None),
                topology=topology,
                loss_fn=lm_loss,
                seed_layers=True,
                base_seed=cfg.run.seed,
                seed_fn=lambda seed: torch.manual_seed(int(seed)),  # as GPT3 seeds its layers
                partition_method="type:Block",
                activation_checkpoint_interval=1 if cfg.model.activation_checkpointing else 0,
                # Only blocks are recomputed; torch's non-reentrant checkpoint also copes with a stage
                # whose first layer (the embedding) takes integer ids that need no gradient.
                checkpointable_layers=["KeyedBlock"],
                activation_checkpoint_func=functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False),
            )
        if cfg.run.fp8 != "off":
            from .fp8 import to_float8

            to_float8(module, cfg, info.device)  # this stage's layers
        # Saved in every checkpoint: what DeepSpeed's universal conversion must know of these layers.
        module.universal_checkpoint_info = universal_checkpoint.pipeline_layout_info()
        self._write_config()
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=module, model_parameters=param_groups(module, cfg.optim.weight_decay), config=self.ds_config
        )
        self.compiled, self.compile_note = compiled(cfg, info.device)
        if self.compiled:
            self.compile_note = "compiled per layer (the pipeline schedule between them eager)"
            self.engine.compile()  # DeepSpeed compiles each layer of this stage in place
        self.runnable = self.module = None  # no single-process forward: the stages hold parts
        self.grid, self._grad_norm = grid, None
        self.clips_itself = clipped_by_strategy(cfg.deepspeed.zero_stage, resolve_precision(info.device, cfg.run.dtype))
        if self.clips_itself:
            # ZeRO 0 in fp32: the engine steps the optimizer itself, with no clipping and no norm
            # (DeepSpeed's own clip would count each stage's gradients as the whole model's): clip the
            # whole model's norm just before it steps, after the gradients are all-reduced.
            self._counted_in_norm = self._parameters_counted_once()
            self.engine.optimizer.register_step_pre_hook(lambda *_: self._clip_whole_model())

    def _parameters_counted_once(self) -> list[torch.nn.Parameter]:
        """This rank's parameters that count toward the whole model's norm: a weight kept whole on every
        tensor rank on rank 0 only, the embedding tied into the last stage on the first stage only."""
        from deepspeed.checkpoint import constants

        info = universal_checkpoint.pipeline_layout_info()
        tied = [re.compile(p) for p in info[constants.PIPELINE_REPLICATED_PARAMETER_PATTERNS]]
        whole = [re.compile(p) for p in info[constants.TP_REPLICATED_PARAMETER_PATTERNS]]
        first_stage, tensor_rank = self.engine.stage_id == 0, self.grid.get_slice_parallel_rank()
        return [
            p
            for name, p in self.engine.module.named_parameters()
            if (first_stage or not any(t.match(name) for t in tied))
            and (tensor_rank == 0 or not any(w.match(name) for w in whole))
        ]

    def _clip_whole_model(self) -> None:
        """Clip this rank's gradients by the norm of the whole model (every stage's and tensor shard's
        gradients counted once), summed over this data-parallel replica's ranks."""
        square = global_grad_norm([p.grad for p in self._counted_in_norm if p.grad is not None]).double() ** 2
        for group in (self.grid.get_slice_parallel_group(), self.grid.get_pipe_parallel_group()):
            torch.distributed.all_reduce(square, group=group)
        self._grad_norm = square.sqrt().float()
        clip_gradients(self.engine.module.parameters(), self.cfg.optim.grad_clip, self._grad_norm)

    def layout_refusal(self, folder: Path, saved: dict) -> str | None:
        """Another tensor or pipeline degree: DeepSpeed's universal format re-splits the engine's own
        ZeRO-1 checkpoints when they record how (see universal_checkpoint.pipeline_layout_info)."""
        tensor, pipeline = universal_checkpoint.saved_degrees(saved)
        if tensor * pipeline > 1 and universal_checkpoint.is_partitioned(folder):
            return self.universal_refusal(folder, saved)
        return super().layout_refusal(folder, saved)

    def universal_refusal(self, folder: Path, saved: dict) -> str | None:
        """The engine's sharded checkpoints convert when they record which weights its stages share."""
        if universal_checkpoint.records_pipeline_layout(saved):
            return None
        return universal_checkpoint.pipeline_refusal(folder, saved, self.info.world_size)

    def resume(self, ckpt_dir: Path, allowed: bool) -> int:
        with torch.no_grad():  # loading broadcasts the tied embedding again (see __init__)
            return super().resume(ckpt_dir, allowed)

    def describe(self) -> str:
        tp, pp = self.cfg.parallel.tensor, self.cfg.parallel.pipeline
        return (
            f"pipeline {pp} x tensor {tp} x data {self.data_parallel_size} (DeepSpeed pipeline engine, "
            f"ZeRO {self.cfg.deepspeed.zero_stage}), stage {self.engine.stage_id}, {self.compile_note}"
        )

    def train_batch(self, batches) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over the step's micro batches: (mean loss, gradient norm before clipping)."""
        loss = self.engine.train_batch(data_iter=iter(((x, keys), y) for x, y, keys in batches))
        norm = self._grad_norm if self.clips_itself else self.engine.get_global_grad_norm()
        return loss.detach().float(), norm_tensor(norm)

    @torch.no_grad()
    def evaluate(self, data, micro_batch: int, num_batches: int) -> dict:
        """Mean validation loss over num_batches micro batches dealt to the data-parallel replicas."""
        per_replica = max(1, num_batches // self.data_parallel_size)
        firsts = [(self.data_rank + k * self.data_parallel_size) * micro_batch for k in range(per_replica)]
        device = self.info.device
        keys = torch.zeros(micro_batch, dtype=torch.int64, device=device)  # the stages' input shape; no dropout in eval
        pairs = (data.batch(first, micro_batch) for first in firsts)
        batches = (((x.to(device), keys), y.to(device)) for x, y in pairs)
        loss = self.engine.eval_batch(iter(batches), num_micro_batches=per_replica).detach().float()
        if torch.distributed.is_initialized():  # every rank holds its replica's loss: mean over all
            torch.distributed.all_reduce(loss)
            loss /= torch.distributed.get_world_size()
        return {"val_loss": loss.item(), "val_ppl": math.exp(min(loss.item(), 50.0))}
