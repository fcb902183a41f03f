"""The GPUs the project knows, each once: the name torch reports for it, its dense tensor-core peak
FLOP/s in each 16-bit precision it has (bf16 only from compute capability 8.0 on: a V100 has fp16
alone), its memory bandwidth and, for those a project can be generated for, the `gpu_type` answers
with their memory. No torch: the copier task and `plan` read it, and so does training (metrics.py,
for the MFU).

    from .gpus import ANSWERS, find_answer, peak_for_device_name
    gpu, memory_gib = find_answer("v100-16gb")             # plan: memory per GPU, precision and peak
    gpu.has_bf16, gpu.peak("fp16")                         # False, 125e12
    peak_for_device_name("NVIDIA H100 80GB HBM3", "bf16")  # metrics: 989e12; None for an unknown device

Peaks are vendor figures without sparsity (fp16 with fp32 accumulation, as mixed precision runs it);
an unknown device gets None rather than a made-up number.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gpu:
    device_name: str
    """A substring of torch.cuda.get_device_name(), e.g. "A100" of "NVIDIA A100-SXM4-40GB"."""
    peaks: dict[str, float]
    """Dense tensor-core peak FLOP/s by precision, "bf16", "fp16" and "fp8"; a GPU without one lacks its key."""
    answers: dict[str, int] = field(default_factory=dict)
    """The gpu_type answers (copier.yml) for this GPU -> memory in GiB; empty where none is offered."""
    bandwidth: float | None = None
    """Memory bandwidth in bytes/s, vendor datasheet (one figure where the memory sizes differ: A100 40 GB
    has 1.555e12, 80 GB 2.039e12); the roofline of memory-bound kernels in bench/gpu_estimate.py."""

    @property
    def has_bf16(self) -> bool:
        return "bf16" in self.peaks

    @property
    def has_fp8(self) -> bool:
        return "fp8" in self.peaks

    def peak(self, precision: str | None = None) -> float:
        """The peak for a training precision ("bf16", "fp16"); for fp32 (or None) the GPU's best 16-bit
        peak, which MFU is measured against whatever a run computes in."""
        return self.peaks.get(precision) or self.peaks["bf16" if self.has_bf16 else "fp16"]


def bf16_and_fp16(flops: float) -> dict[str, float]:
    """Peaks of a GPU whose tensor cores run bf16 and fp16 (with fp32 accumulation) equally fast."""
    return {"bf16": flops, "fp16": flops}


def with_fp8(flops: float, fp8_flops: float) -> dict[str, float]:
    """Peaks of a GPU that also multiplies in fp8 (compute capability 8.9 on: Ada, Hopper, Blackwell)."""
    return {**bf16_and_fp16(flops), "fp8": fp8_flops}


# First match of the device name wins, so the more specific names come first.
GPUS = (
    Gpu("H100 PCIe", with_fp8(756e12, 1513e12), bandwidth=2.0e12),
    Gpu("H100 NVL", with_fp8(835e12, 1671e12), bandwidth=3.9e12),
    Gpu("H100", with_fp8(989e12, 1979e12), {"h100-80gb": 80}, bandwidth=3.35e12),  # SXM
    Gpu("GH200", with_fp8(989e12, 1979e12), bandwidth=4.0e12),  # before H200, which its name contains
    Gpu("H200", with_fp8(989e12, 1979e12), {"h200-141gb": 141}, bandwidth=4.8e12),
    Gpu("H800", with_fp8(989e12, 1979e12), {"h800-80gb": 80}, bandwidth=3.35e12),
    Gpu("H20", with_fp8(148e12, 296e12), bandwidth=4.0e12),
    Gpu("B200", with_fp8(2250e12, 4500e12), bandwidth=8.0e12),
    Gpu("A100", bf16_and_fp16(312e12), {"a100-40gb": 40, "a100-80gb": 80}, bandwidth=2.0e12),
    Gpu("A800", bf16_and_fp16(312e12), {"a800-40gb": 40, "a800-80gb": 80}, bandwidth=2.0e12),
    Gpu("A40", bf16_and_fp16(150e12), bandwidth=0.696e12),
    Gpu("A10", bf16_and_fp16(125e12), bandwidth=0.6e12),
    Gpu("L40S", with_fp8(362e12, 733e12), {"l40s-48gb": 48}, bandwidth=0.864e12),
    Gpu("L40", with_fp8(181e12, 362e12), bandwidth=0.864e12),
    Gpu("L4", with_fp8(121e12, 242e12), bandwidth=0.3e12),
    Gpu("RTX 4090", with_fp8(165e12, 330e12), {"rtx4090-24gb": 24}, bandwidth=1.008e12),
    Gpu("V100", {"fp16": 125e12}, {"v100-16gb": 16, "v100-32gb": 32}, bandwidth=0.9e12),  # Volta: no bf16
)

ANSWERS = tuple(answer for gpu in GPUS for answer in gpu.answers)


def find_answer(gpu_type: str) -> tuple[Gpu, int] | None:
    """(the GPU, its memory in GiB) of a gpu_type answer; None for an answer the table lacks."""
    return next(((gpu, gpu.answers[gpu_type]) for gpu in GPUS if gpu_type in gpu.answers), None)


def peak_for_device_name(name: str, precision: str | None = None) -> float | None:
    """Dense peak FLOP/s (Gpu.peak) of the device torch names `name`; None for a device the table lacks."""
    return next((gpu.peak(precision) for gpu in GPUS if gpu.device_name in name), None)
