"""FSDP2 (torch's fully_shard): each repeated block and then the whole model sharded over the ranks,
weights, gradients and optimizer state alike; checkpoints through torch.distributed.checkpoint.

    <package> train run.strategy=fsdp
    <package> train run.strategy=fsdp fsdp.reshard_after_forward=false fsdp.offload=true

settings.py is its `fsdp:` section, plan.py what plan and check know of it, strategy.py the
strategy, sharded_checkpoint.py its checkpoints (one folder of shards per step, read on any world size).
"""
