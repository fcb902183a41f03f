"""What FSDP2 keeps on a GPU and what it allows, without torch (strategies/memory.py finds PLAN; its
config section is settings.py): weights, gradients and optimizer state sharded over the ranks
(stage 3), all three on the host under fsdp.offload. No tensor or pipeline layouts.
"""

from __future__ import annotations

from ...models.family import family
from ...settings.config import Config, Problem, changed
from ...settings.sharding import Sharding
from ..memory import StrategyPlan


class FSDPPlan(StrategyPlan):
    name = "fsdp"
    label = "FSDP2"
    stages = (3,)
    builds = "fsdp.strategy:FSDPStrategy"
    muon_state_sharded = False  # Muon gathers each matrix and keeps its momentum whole on every rank
    gathers_fp8 = True  # torchao's fp8 all-gather of FSDP2's sharded weights

    def at(self, cfg: Config, sharding: Sharding) -> Config:
        offload = sharding.offload_optimizer or sharding.offload_params
        return changed(cfg, **{"run.strategy": self.name, "fsdp.offload": offload})

    def settings(self, old: Config, new: Config) -> tuple[list[str], list[str]]:
        keys, answers = super().settings(old, new)
        if new.fsdp.offload != old.fsdp.offload:
            keys.append(f"fsdp.offload={str(new.fsdp.offload).lower()}")
        return keys, answers

    def describe(self, cfg: Config) -> str:
        return "FSDP2 (weights, gradients and optimizer state sharded)" + (
            " + offload to CPU" if cfg.fsdp.offload else ""
        )

    def describe_sharding(self, sharding: Sharding) -> str:
        return "FSDP2, fully sharded" + (" with everything offloaded to CPU" if sharding.offload_params else "")

    def gathered_bytes(self, cfg: Config, shape: dict, vocab_size: int, precision: str) -> float:
        """What strategy.shard_model gathers beyond the shards. The model's own tensors (head,
        norms, scalars, small or tied tables) in fp32, gathered once per step and kept to its end,
        with their fp32 gradients; an embedding table at least as large as a block is a unit of its
        own (strategy.separate_tables), gathered in fp32 while looked up: the largest, with its
        gradient. Blocks in bf16 under bf16 (else fp32): the one computing and the next, prefetched,
        under reshard_after_forward, else every block from its forward to its backward; and one
        block's gradients in that dtype with their fp32 copy for the reduce-scatter."""
        fam = family(cfg.model.arch)
        block = fam.repeated_block_params(shape, vocab_size)
        tables = [t for t in fam.lookup_tables(shape, vocab_size) if t >= block]
        outside = fam.num_params(shape, vocab_size, cfg.model.sequence_len) - shape["n_layer"] * block
        own = max(0, outside - sum(tables))
        width = 2 if precision == "bf16" else 4
        held = 2 if cfg.fsdp.reshard_after_forward else shape["n_layer"]
        block_grads = block * width + (4 * block if width != 4 else 0)
        return 8 * own + 8 * max(tables, default=0) + held * block * width + block_grads

    def precision_problems(self, cfg: Config, precision: str, gpu_name: str) -> list[Problem]:
        if precision != "fp16":
            return []
        how = (
            "run.dtype=fp16"
            if cfg.run.dtype == "fp16"
            else f"run.dtype={cfg.run.dtype} trains in fp16 on the {gpu_name} (no bf16)"
        )
        return [
            Problem(
                f"{how} with run.strategy=fsdp: FSDP2 here has no loss scaler; use run.dtype=bf16 or fp32, or "
                "run.strategy=ddp (torch's GradScaler)",
                "run.dtype",
                "run.strategy",
                "cluster.gpu_type",
            )
        ]


PLAN = FSDPPlan()
