"""Pipeline and tensor parallelism for a family with layouts: DeepSpeed's PipelineModule + pipeline engine.

    <package> train parallel.pipeline=4 parallel.tensor=2      # world = data x 4 x 2

The world is a grid (DeepSpeed's PipeModelDataParallelTopology, axes pipe x data x model): ranks
next to each other share a tensor-parallel group (keep it inside a node), then data, then pipeline
stages. The layers are the family's (its descriptor's pipeline hook, e.g. models/gpt3/model.py
pipeline_layers), split over the stages by counting blocks, each block sharded over its
tensor-parallel group as it is built (strategies/deepspeed/tensor_parallel.py); a tied layer (gpt3's
embedding) sits on the first stage and again on the last for the head (DeepSpeed all-reduces the
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

from ...models.family import PipelineLayers, family
from ...runtime.run_context import Run
from ...settings.config import Config, ModelConfig
from ..common import clip_gradients, compiled, global_grad_norm, param_groups
from . import universal_checkpoint
from .engine import (
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
    state with "model": the whole model's weights in fp32."""
    states = load_model_states(folder)
    saved = Config(model=ModelConfig(**states["config"]["model"]))
    return trained_state(states, consolidated_weights(folder, family(saved.model.arch).pipeline(saved, 0)))


def consolidated_weights(folder: Path, pipeline: PipelineLayers) -> dict:
    """The one-process model's state dict from the files DeepSpeed writes per layer and tensor rank
    (layer_XX-model_YY-model_states.pt, XX the layer's index in the pipeline; a tied copy is skipped)."""
    state: dict = {}
    for index, layer in enumerate(pipeline.layers):
        if layer.prefix is None:
            continue
        shards = sorted(Path(folder).glob(f"layer_{index:02d}-model_*-model_states.pt"))
        if not shards:
            raise FileNotFoundError(f"{folder} has no file for pipeline layer {index} (layer_{index:02d}-model_*)")
        parts = [torch.load(f, map_location="cpu", weights_only=True) for f in shards]
        for key, value in parts[0].items():  # only blocks are tensor-parallel
            state[layer.prefix + key] = join_shards(key, [p[key] for p in parts], pipeline) if layer.block else value
    return state


def layer_specs(pipeline: PipelineLayers, tp_group):
    """The family's layers as DeepSpeed's layer specs: tied ones shared, blocks sharded over the
    tensor-parallel group once built whole under their layer's seed."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    class ShardedBlockSpec(LayerSpec):
        def build(self, log=False):
            return parallelize_block(super().build(log), tp_group, pipeline)

    def spec(layer):
        if layer.tied:
            return TiedLayerSpec(layer.tied, layer.kind, *layer.args, forward_fn=layer.forward,
                                 tied_weight_attr=list(layer.tied_weights))  # fmt: skip
        return (ShardedBlockSpec if layer.block else LayerSpec)(layer.kind, *layer.args)

    return [spec(layer) for layer in pipeline.layers]


class PipelineStrategy(DeepSpeedStrategy):
    name = "pipeline"
    consumes_batches = True

    def __init__(self, run: Run, vocab_size: int, resume: bool = False):
        deepspeed = import_deepspeed()
        from deepspeed.pipe import PipelineModule
        from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology

        cfg = run.cfg
        self.cfg, self.run, self.accum = cfg, run, run.grad_accum
        self._init_process_group(deepspeed)
        tp, pp, dp = run.tensor_parallel_size, run.pipeline_parallel_size, run.data_parallel_size
        self.ds_config = deepspeed_config(cfg, run.grad_accum, dp, run.device, precision=run.precision)
        refuse_unsupported_precision(self.ds_config, run.device, cfg.run.dtype)
        self.find_resume_point(resume, dp)
        topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
        grid = PipelineParallelGrid(topology=topology)  # the tensor-parallel groups the blocks need now
        self.data_rank = grid.get_data_parallel_id()
        self.resumed_state = {}
        pipeline = run.family.pipeline(cfg, vocab_size)
        with torch.device("meta"):  # sizes of the whole model, without allocating it
            whole = pipeline.whole()
        self.num_params, self.flops_per_token = whole.num_params(), whole.flops_per_token()
        # DeepSpeed broadcasts the tied embedding from its first stage to its last (in-place, as the
        # module is built and again after loading a checkpoint). Under grad mode autograd records it,
        # and every backward then warns that c10d::broadcast_ has no gradient: not needed, since the
        # copies' gradients are all-reduced separately. Without grad mode nothing is recorded.
        with torch.no_grad():
            module = PipelineModule(
                layers=layer_specs(pipeline, grid.get_slice_parallel_group() if tp > 1 else None),
                topology=topology,
                loss_fn=pipeline.loss,
                seed_layers=True,
                base_seed=cfg.run.seed,
                seed_fn=lambda seed: torch.manual_seed(int(seed)),  # as the one-process model seeds its layers
                partition_method=f"type:{pipeline.block_type}",
                activation_checkpoint_interval=1 if cfg.model.activation_checkpointing else 0,
                # Only blocks are recomputed; torch's non-reentrant checkpoint also copes with a stage
                # whose first layer (the embedding) takes integer ids that need no gradient.
                checkpointable_layers=[pipeline.block_type],
                activation_checkpoint_func=functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False),
            )
        if cfg.run.fp8 != "off":
            from ..fp8 import to_float8

            to_float8(module, run)  # this stage's layers
        # Saved in every checkpoint: what DeepSpeed's universal conversion must know of these layers.
        module.universal_checkpoint_info = universal_checkpoint.pipeline_layout_info(pipeline)
        self.pipeline = pipeline
        self._write_config()
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=module, model_parameters=param_groups(module, cfg.optim.weight_decay), config=self.ds_config
        )
        self.compiled, self.compile_note = compiled(cfg.run, run.device)
        if self.compiled:
            self.compile_note = "compiled per layer (the pipeline schedule between them eager)"
            self.engine.compile()  # DeepSpeed compiles each layer of this stage in place
        self.runnable = self.module = None  # no single-process forward: the stages hold parts
        self.grid, self._grad_norm = grid, None
        self.clips_itself = clipped_by_strategy(run.sharding.stage, run.precision)
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

        info = universal_checkpoint.pipeline_layout_info(self.pipeline)
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
        return universal_checkpoint.pipeline_refusal(folder, saved, self.run.world_size)

    def resume(self, ckpt_dir: Path, allowed: bool) -> int:
        with torch.no_grad():  # loading broadcasts the tied embedding again (see __init__)
            return super().resume(ckpt_dir, allowed)

    def describe(self) -> str:
        tp, pp = self.run.tensor_parallel_size, self.run.pipeline_parallel_size
        return (
            f"pipeline {pp} x tensor {tp} x data {self.run.data_parallel_size} (DeepSpeed pipeline engine, "
            f"ZeRO {self.run.sharding.stage}), stage {self.engine.stage_id}, {self.compile_note}"
        )

    def local_weights(self) -> list[torch.Tensor]:
        """The weights this rank holds: its stage's (its tensor-parallel shards of them)."""
        return list(self.engine.module.parameters())

    def train_batch(self, batches) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over the step's micro batches: (mean loss, gradient norm before clipping)."""
        loss = self.engine.train_batch(data_iter=iter(((x, keys), y) for x, y, keys in batches))
        norm = self._grad_norm if self.clips_itself else self.engine.get_global_grad_norm()
        return loss.detach().float(), norm_tensor(norm)

    @torch.no_grad()
    def evaluate(self, data, micro_batch: int, num_batches: int) -> dict:
        """Mean validation loss over num_batches micro batches dealt to the data-parallel replicas."""
        per_replica = max(1, num_batches // self.run.data_parallel_size)
        firsts = [(self.data_rank + k * self.run.data_parallel_size) * micro_batch for k in range(per_replica)]
        device = self.run.device
        keys = torch.zeros(micro_batch, dtype=torch.int64, device=device)  # the stages' input shape; no dropout in eval
        pairs = (data.batch(first, micro_batch) for first in firsts)
        batches = (((x.to(device), keys), y.to(device)) for x, y in pairs)
        loss = self.engine.eval_batch(iter(batches), num_micro_batches=per_replica).detach().float()
        if torch.distributed.is_initialized():  # every rank holds its replica's loss: mean over all
            torch.distributed.all_reduce(loss)
            loss /= torch.distributed.get_world_size()
        return {"val_loss": loss.item(), "val_ppl": math.exp(min(loss.item(), 50.0))}
