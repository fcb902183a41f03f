"""DeepSpeed, in one folder: present where the project was made with strategy=deepspeed or a family
with parallel layouts (gpt3), absent otherwise (settings/optional_parts.py says how to add it).

    engine.py                ZeRO 0-3 with offload: the DeepSpeed strategy and its checkpoints
    pipeline.py              the pipeline engine for families with layers (gpt3's data x tensor x pipeline)
    tensor_parallel.py       shards a block's matrices over the tensor-parallel group
    universal_checkpoint.py  a ZeRO checkpoint continued on another data-parallel size or layout
    launcher.py              DeepSpeed's own launcher (`launch devmachine|slurm --launcher deepspeed`)
    settings.py              its section of config/train.yaml (`deepspeed:`), torch-free
    plan.py                  what it keeps on a GPU and allows, for plan, fit and check (torch-free)
"""
