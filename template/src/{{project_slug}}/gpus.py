"""The GPUs the project knows, each once: the name torch reports for it, its dense peak FLOP/s and,
for those a project can be generated for, the `gpu_type` answers with their memory. No torch: the
copier task and `plan` read it, and so does training (metrics.py, for the MFU).

    from .gpus import ANSWERS, find_answer, peak_for_device_name
    gpu, memory_gib = find_answer("a100-40gb")             # plan: memory per GPU, peak for the time table
    peak_for_device_name("NVIDIA H100 80GB HBM3")          # metrics: 989e12; None for an unknown device

Peaks are vendor figures without sparsity; an unknown device gets None rather than a made-up number.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gpu:
    device_name: str
    """A substring of torch.cuda.get_device_name(), e.g. "A100" of "NVIDIA A100-SXM4-40GB"."""
    peak_flops: float
    """Dense bf16 tensor-core peak, FLOP/s."""
    answers: dict[str, int] = field(default_factory=dict)
    """The gpu_type answers (copier.yml) for this GPU -> memory in GiB; empty where none is offered."""


# Dense bf16 tensor-core peak per GPU, FLOP/s. First match of the device name wins, so the
# more specific names come first.
GPUS = (
    Gpu("H100 PCIe", 756e12),
    Gpu("H100 NVL", 835e12),
    Gpu("H100", 989e12, {"h100-80gb": 80}),  # SXM
    Gpu("GH200", 989e12),  # before H200, which its name contains
    Gpu("H200", 989e12, {"h200-141gb": 141}),
    Gpu("H800", 989e12, {"h800-80gb": 80}),
    Gpu("H20", 148e12),
    Gpu("B200", 2250e12),
    Gpu("A100", 312e12, {"a100-40gb": 40, "a100-80gb": 80}),
    Gpu("A800", 312e12, {"a800-40gb": 40, "a800-80gb": 80}),
    Gpu("A40", 150e12),
    Gpu("A10", 125e12),
    Gpu("L40S", 362e12, {"l40s-48gb": 48}),
    Gpu("L40", 181e12),
    Gpu("L4", 121e12),
    Gpu("RTX 4090", 165e12, {"rtx4090-24gb": 24}),
    Gpu("V100", 125e12, {"v100-16gb": 16, "v100-32gb": 32}),  # fp16: V100 has no bf16
)

ANSWERS = tuple(answer for gpu in GPUS for answer in gpu.answers)


def find_answer(gpu_type: str) -> tuple[Gpu, int] | None:
    """(the GPU, its memory in GiB) of a gpu_type answer; None for an answer the table lacks."""
    return next(((gpu, gpu.answers[gpu_type]) for gpu in GPUS if gpu_type in gpu.answers), None)


def peak_for_device_name(name: str) -> float | None:
    """Dense peak FLOP/s of the device torch names `name`; None for a device the table lacks."""
    return next((gpu.peak_flops for gpu in GPUS if gpu.device_name in name), None)
