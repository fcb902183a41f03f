"""GPU time of one training micro batch, estimated on this machine: ours against transformers' peer.

For one micro batch of each model family at its default size and shape (forward, loss, backward;
bf16 weights, eager), the model runs on the meta device under a TorchDispatchMode that counts every
kernel it would launch on a GPU: its FLOPs (torch.utils.flop_counter's formulas, matmuls only), the
bytes it reads and writes (its tensor inputs and outputs) and the roofline time on a GPU of gpus.py,
max(FLOPs / bf16 peak, bytes / memory bandwidth), summed over the kernels. Beside it the
matmul-only bound (matmul FLOPs / peak) and their ratio: how far the step is from compute-bound.

    gpt   d20, 16 x 2048 tokens, vocab 32768     ours vs NanoChatForCausalLM
    gpt3  125M, 8 x 2048; 1.3B, 4 x 2048 (the template's micro batches), vocab 50304   vs GPT2LMHeadModel
    bert  large, 16 x 512, vocab 30522           vs BertForMaskedLM (SDPA, torch's dropout)

The peer is the transformers model the family exports to (its descriptor's exporter, as `export`
converts a trained model), with SDPA attention and no KV cache (a training step keeps none), so each
pair has the same layers, width, heads, vocabulary, sequence and dropout probabilities (ours as the
project builds it by default; NanoChat has no residual dropout). The meta device runs what a CPU
would, so the GPU's lowering is modelled where it differs (GpuLowering): F.scaled_dot_product_attention
is one flash kernel forward and one backward (FLOPs halved when causal; dropout inside stays fused),
F.dropout one kernel that also writes a byte mask and one that reads it back, F.rms_norm torch's fused
CUDA kernel. Views cost nothing, allocation (empty) neither; any other op, a custom one included, is
one kernel with its tensor bytes (a tensor passed twice read once, an out= tensor only written),
except copy_ (its destination written, not read) and the ops that touch only the indexed elements of
a large operand (gather, in-place scatter, nll_loss and its backward: those elements). What depends
on data the meta device lacks: a boolean mask's count of True is --mask-share of its elements
(BERT's 15% predicted positions), a value read on the host (.item(), transformers' mask checks) is
True or 1. Weights and buffers are bf16 (model.to), and the step runs once before the counted one
(caches filled, as in training). Then each dropout site alone: ours (models/sample_dropout.py)
against torch's, in kernels and bytes.

The head and the loss (every kernel from the last block's output on in forward, and in backward until
the gradient is back at that output) are also summed apart, for ours and the peer: their share of
the step. Our GPTs compute their training loss in chunks of tokens (models/lm_loss.py): per chunk the
head's matmul, the loss, the gradient with respect to the logits and the hidden states' rows, and per
four chunks a matmul into the head's gradient added to its fp32 sum (vocab x width read and written
each time); backward only scales what forward kept. It is counted as it runs eager, one kernel per
op of a chunk: compiled on a GPU (run.compile), Inductor fuses a chunk's elementwise ops into a few
kernels, which this count credits neither to ours nor to the peer's (whole-logits) loss.

    python bench/gpu_estimate.py                  # every family on an H100 SXM, about a minute
    python bench/gpu_estimate.py --gpu A100 --only bert --top 12
    python bench/gpu_estimate.py --tiny           # tiny sizes: checks the script (the test runs this)

The last lines, one per family, end with `ours/peer <ratio>` of the estimated times. The estimate
ignores launch latency (the `+launch` column adds --launch-us per kernel), caches, overlap and
kernel efficiency below the roofline: it compares kernels and traffic, it does not predict a clock.
It renders a project from this template with copier (or imports --project PATH).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

TEMPLATE_ROOT = Path(__file__).resolve().parent.parent
GPUS_FILE = TEMPLATE_ROOT / "template" / "src" / "{{project_slug}}" / "settings" / "gpus.py"
aten = torch.ops.aten


@dataclass(frozen=True)
class Run:
    """One family's model at one size and micro batch shape."""

    name: str
    arch: str
    size: str
    batch: int
    seq: int
    vocab: int


DEFAULT_RUNS = (
    Run("gpt d20", "gpt", "d20", 16, 2048, 32768),
    Run("gpt3 125M", "gpt3", "125M", 8, 2048, 50304),
    Run("gpt3 1.3B", "gpt3", "1.3B", 4, 2048, 50304),
    Run("bert large", "bert", "large", 16, 512, 30522),
)
TINY_RUNS = (
    Run("gpt tiny", "gpt", "tiny", 2, 64, 512),
    Run("gpt3 tiny", "gpt3", "tiny", 2, 64, 512),
    Run("bert tiny", "bert", "tiny", 2, 64, 512),
)


# ---------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------


@dataclass
class Kernel:
    name: str
    flops: float
    bytes: float
    head: bool = False  # launched by the head and the loss (after the last block, forward and backward)


@dataclass
class Tally:
    kernels: list[Kernel] = field(default_factory=list)
    in_head: bool = False  # set while the head and the loss run (mark_head)

    def record(self, name: str, flops: float, nbytes: float) -> None:
        self.kernels.append(Kernel(name, flops, nbytes, self.in_head))

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.kernels)

    @property
    def bytes(self) -> float:
        return sum(k.bytes for k in self.kernels)

    def time_s(self, peak: float, bandwidth: float) -> float:
        return sum(max(k.flops / peak, k.bytes / bandwidth) for k in self.kernels)

    def matmul_s(self, peak: float) -> float:
        """The matmul-only bound: every FLOP counted is a matmul's (attention's included)."""
        return self.flops / peak

    def head_s(self, peak: float, bandwidth: float) -> float:
        """The estimated time of the head and loss's kernels (mark_head)."""
        return sum(max(k.flops / peak, k.bytes / bandwidth) for k in self.kernels if k.head)

    def by_name(self, peak: float, bandwidth: float) -> dict[str, tuple[float, int]]:
        """op name -> (estimated seconds, kernels)."""
        ops: dict[str, list] = defaultdict(lambda: [0.0, 0])
        for k in self.kernels:
            ops[k.name][0] += max(k.flops / peak, k.bytes / bandwidth)
            ops[k.name][1] += 1
        return {name: (s, n) for name, (s, n) in ops.items()}


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses: an expanded (stride 0) dimension is read once."""
    elements = 1
    for size, stride in zip(t.shape, t.stride()):
        elements *= size if stride else 1
    return elements * t.element_size()


def tensors_in(tree) -> list[torch.Tensor]:
    flat = tree if isinstance(tree, (list, tuple)) else [tree]
    out = []
    for item in flat:
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, (list, tuple)):
            out.extend(tensors_in(item))
    return out


ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}
UNANNOTATED_VIEWS = {"_unsafe_view"}  # a view whose schema does not say so (reshape, matmul use it)


def launches_no_kernel(func) -> bool:
    """Views and metadata ops alias their input (a return with alias info that is not written);
    allocation reserves memory without a kernel."""
    returns = func._schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return True
    return func._schema.name.split("::")[-1] in ALLOCATIONS | UNANNOTATED_VIEWS


def touched_bytes(packet, args, outputs: list[torch.Tensor]) -> int | None:
    """Bytes of an op whose kernel moves less than all its tensors: one that touches only the elements
    an index names in a large operand, or copy_ (writes its destination, reads only the source); None
    for any other op."""
    if packet is aten.copy_:  # (self, src)
        return tensor_bytes(args[0]) + tensor_bytes(args[1])
    if packet is aten.gather:  # (self, dim, index): one element of self read per index, written out
        self, _, index = args[:3]
        return tensor_bytes(index) + 2 * index.numel() * self.element_size()
    if packet in (aten.scatter_, aten.scatter_add_):  # (self, dim, index, src or value), in place
        self, _, index, src = args[:4]
        src_bytes = tensor_bytes(src) if isinstance(src, torch.Tensor) else 0
        return tensor_bytes(index) + src_bytes + 2 * index.numel() * self.element_size()
    if packet is aten.nll_loss_forward:  # (self, target, ...): one log-probability read per target
        self, target = args[:2]
        return tensor_bytes(target) + target.numel() * self.element_size() + sum(map(tensor_bytes, outputs))
    if packet is aten.nll_loss_backward:  # (grad_output, self, target, ...): writes the gradient, reads no self
        grad_output, _, target = args[:3]
        return tensor_bytes(grad_output) + tensor_bytes(target) + sum(map(tensor_bytes, outputs))
    return None


class CountKernels(TorchDispatchMode):
    """Every aten (or custom) op that reaches the meta device: one kernel, its FLOPs and bytes."""

    def __init__(self, tally: Tally, mask_share: float):
        super().__init__()
        self.tally, self.mask_share = tally, mask_share

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.index.Tensor:
            args = (args[0], [long for index in args[1] for long in self.expected_nonzero(index)])
        if func is aten._local_scalar_dense.default:
            # .item(): a meta tensor holds no value. The host checks reading one here (transformers:
            # are sequences packed, may the mask be skipped) get the answer true data gives: True.
            self.tally.record(str(func._overloadpacket), 0, tensor_bytes(args[0]))
            return True if args[0].dtype == torch.bool else 1
        out = func(*args, **kwargs)
        if launches_no_kernel(func):
            return out
        outputs = tensors_in(out)
        if not outputs:
            return out
        packet = func._overloadpacket
        flops = flop_registry[packet](*args, **kwargs, out_val=out) if packet in flop_registry else 0
        nbytes = touched_bytes(packet, args, outputs)
        if nbytes is None:
            # A tensor passed twice is read once; an out= tensor is written, not read.
            read = tensors_in(list(args) + [v for k, v in kwargs.items() if k != "out"])
            nbytes = sum(map(tensor_bytes, {id(t): t for t in read}.values())) + sum(map(tensor_bytes, outputs))
        self.tally.record(str(packet), flops, nbytes)
        return out

    def expected_nonzero(self, index) -> list:
        """A boolean index as the long indices of its True elements, one per dimension it covers (what
        CUDA's nonzero kernel makes); the meta device cannot count them: mask_share of the elements."""
        if index is None or index.dtype != torch.bool:
            return [index]
        found = torch.empty(round(self.mask_share * index.numel()), dtype=torch.long, device=index.device)
        self.tally.record("aten.nonzero", 0, tensor_bytes(index) + index.dim() * tensor_bytes(found))
        return [found] * index.dim()


def heads_second(like: torch.Tensor, dim: int) -> torch.Tensor:
    """(B, heads, T, dim) laid out as (B, T, heads, dim), as torch's CUDA flash kernels write their output
    and gradients: the usual transpose and reshape to (B, T, width) around attention copy nothing."""
    B, H, T, _ = like.shape
    return like.new_empty(B, T, H, dim).transpose(1, 2)


class FusedAttention(torch.autograd.Function):
    """Flash attention: one kernel each way, reading and writing q, k, v, the output (and its
    gradients), plus the fp32 log-sum-exp per query row; the mask too where one is given."""

    @staticmethod
    def forward(ctx, tally, q, k, v, mask, causal):
        out = heads_second(q, v.shape[-1])
        share = 0.5 if causal else 1.0
        lse = q.shape[:-1].numel() * 4
        extra = lse + (tensor_bytes(mask) if mask is not None else 0)
        qkv_out = sum(map(tensor_bytes, (q, k, v, out)))
        flops = flop_registry[aten._scaled_dot_product_flash_attention](q, k, v, out_val=out) * share
        tally.record("flash_attention", flops, qkv_out + extra)
        backward = flop_registry[aten._scaled_dot_product_flash_attention_backward](out, q, k, v) * share
        # backward reads q, k, v, out and dout, writes dq, dk and dv: twice the forward's tensors
        ctx.backward = (tally, backward, 2 * qkv_out + extra)
        ctx.shapes = (q, k, v)  # only their shapes and strides: meta tensors hold no data
        return out

    @staticmethod
    def backward(ctx, grad):
        tally, flops, nbytes = ctx.backward
        tally.record("flash_attention_backward", flops, nbytes)
        return (None, *(heads_second(t, t.shape[-1]) for t in ctx.shapes), None, None)


class FusedElementwise(torch.autograd.Function):
    """A fused kernel each way with given byte counts (torch's CUDA dropout, fused RMSNorm), for x
    and an optional weight."""

    @staticmethod
    def forward(ctx, tally, name, x, weight, forward_bytes, backward_bytes):
        tally.record(name, 0, forward_bytes)
        ctx.backward = (tally, f"{name}_backward", backward_bytes)
        ctx.weight = weight
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx, grad):
        tally, name, nbytes = ctx.backward
        tally.record(name, 0, nbytes)
        weight_grad = None if ctx.weight is None else torch.empty_like(ctx.weight)
        return None, None, grad.new_empty(grad.shape), weight_grad, None, None


class GpuLowering(TorchFunctionMode):
    """The calls a CUDA device runs as one fused kernel where the meta device decomposes them."""

    def __init__(self, tally: Tally):
        super().__init__()
        self.tally = tally
        self.lowered = {
            F.scaled_dot_product_attention: self.attention,
            F.dropout: self.dropout,
            F.rms_norm: self.rms_norm,
        }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.lowered.get(func, func)(*args, **(kwargs or {}))

    def attention(
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        return FusedAttention.apply(self.tally, query, key, value, attn_mask, is_causal)

    def dropout(self, input, p=0.5, training=True, inplace=False):
        if not training or p == 0:  # aten::dropout returns its input: no kernel
            return input
        x, mask = tensor_bytes(input), input.numel()  # native_dropout's mask: one byte per element
        return FusedElementwise.apply(self.tally, "native_dropout", input, None, 2 * x + mask, 2 * x + mask)

    def rms_norm(self, input, normalized_shape, weight=None, eps=None):
        x, w = tensor_bytes(input), tensor_bytes(weight) if weight is not None else 0
        rstd = input.numel() // torch.Size(normalized_shape).numel() * 4  # fp32 per row
        # forward reads x (and the gain), writes y and rstd; backward reads dy, x, rstd, writes dx (and dgain)
        forward, backward = 2 * x + w + rstd, 3 * x + rstd + 2 * w
        return FusedElementwise.apply(self.tally, "fused_rms_norm", input, weight, forward, backward)


def last_block(model: torch.nn.Module) -> torch.nn.Module:
    """The last transformer block: the last module of the model's longest ModuleList (ours and
    transformers' keep their blocks in one)."""
    return max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len)[-1]


@contextlib.contextmanager
def mark_head(model: torch.nn.Module | None, tally: Tally):
    """Kernels from the last block's output on in forward (final norm, head, loss), and in backward
    until the gradient reaches that output, marked as the head's (Kernel.head)."""
    if model is None:
        yield
        return

    def after_last_block(module, args, output):
        tally.in_head = True
        out = output if isinstance(output, torch.Tensor) else output[0]
        if out.requires_grad:
            out.register_hook(lambda grad: setattr(tally, "in_head", False))

    handle = last_block(model).register_forward_hook(after_last_block)
    try:
        yield
    finally:
        handle.remove()
        tally.in_head = False


def count_step(step, context=contextlib.nullcontext, mask_share: float = 0.15, model=None) -> Tally:
    """Kernels of step() (forward, loss and backward). It runs twice and the second is counted: the
    first fills what a training run keeps between steps (cached tables, keyed dropout's positions).
    With the model, the kernels of its head and loss are marked (mark_head)."""
    for _ in range(2):
        tally = Tally()
        with context(), mark_head(model, tally), GpuLowering(tally), CountKernels(tally, mask_share):
            step()
    return tally


# ---------------------------------------------------------------------------
# The generated project and the models
# ---------------------------------------------------------------------------


def load_gpus():
    spec = importlib.util.spec_from_file_location("template_gpus", GPUS_FILE)
    gpus = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gpus  # dataclasses look their module up there
    spec.loader.exec_module(gpus)
    return gpus.GPUS


def import_project(project: Path):
    """The generated package's models, settings.config, models.sample_dropout and models.family modules."""
    found = sorted((project / "src").glob("*/models/family.py"))
    if len(found) != 1:
        raise RuntimeError(f"expected exactly one src/<package>/models/family.py under {project}, found {len(found)}")
    src, slug = found[0].parents[2], found[0].parents[1].name
    sys.path.insert(0, str(src))
    return [
        importlib.import_module(f"{slug}.{name}")
        for name in ("models", "settings.config", "models.sample_dropout", "models.family")
    ]


def build_ours(models, config_mod, run: Run, dropout: float | None, attention_dropout: float | None):
    """The project's model as its trainer builds it (build_model), on the meta device in bf16, and
    the config it was built from."""
    cfg = config_mod.Config()
    m = cfg.model
    m.arch, m.size, m.sequence_len, m.dropout = run.arch, run.size, run.seq, dropout
    if attention_dropout is not None:
        if not hasattr(m, "attention_dropout"):
            raise SystemExit("--attention-dropout: this project's model config has no attention_dropout")
        m.attention_dropout = attention_dropout
    with torch.device("meta"):
        return cfg, models.build_model(cfg, run.vocab).to(torch.bfloat16).train()


def dropout_of(ours, fam, model_cfg, dropout_mod) -> tuple[float, float]:
    """(hidden, attention) dropout probabilities our built model trains with: model.dropout, or where
    it is null the p its dropout layers keep (a transformers model keeps its config's), else none;
    model.attention_dropout where the family has an attention dropout."""
    kept = [m.p for m in ours.modules() if isinstance(m, dropout_mod.KeyedDropout)]
    hidden = model_cfg.dropout if model_cfg.dropout is not None else max(kept, default=0.0)
    attention = (model_cfg.attention_dropout or 0.0) if fam.attention_dropout else 0.0
    return hidden, attention


def build_peer(ours, fam):
    """transformers' model the family exports to, from our built model: the same dimensions and
    dropout. SDPA attention and no KV cache, as a training step runs it; on meta in bf16."""
    import transformers

    transformers.logging.set_verbosity_error()
    with torch.device("meta"):
        peer = fam.to_transformers(ours)
    peer.config.use_cache = False
    peer.set_attn_implementation("sdpa")
    return peer.to(torch.bfloat16).train()


def batch(run: Run, causal: bool, mask_share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and targets on meta: next tokens for a causal LM (the same ids: HF shifts them itself,
    ours would be given the shifted ones), for a masked LM the ids at mask_share of the positions,
    else -100."""
    ids = torch.randint(0, run.vocab, (run.batch, run.seq), device="meta")
    if causal:
        return ids, ids
    return ids, torch.where(torch.rand(ids.shape, device="meta") < mask_share, ids, -100)


def step_of(model, ids, targets, peer: bool):
    def step():
        loss = model(input_ids=ids, labels=targets).loss if peer else model(ids, targets)
        loss.backward()
        model.zero_grad(set_to_none=True)  # as the trainer does after each optimizer step

    return step


# ---------------------------------------------------------------------------
# Dropout sites
# ---------------------------------------------------------------------------


def dropout_site(dropout_mod, shape: tuple[int, ...], p: float) -> tuple[Tally, Tally]:
    """One dropout site of this shape (bf16), forward and backward: (ours keyed, torch's)."""
    x = torch.empty(shape, dtype=torch.bfloat16, device="meta", requires_grad=True)
    grad = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    keys = dropout_mod.sample_keys(1337, 0, 0, shape[0], device="meta")

    def step(dropout):
        def run():
            dropout(x).backward(grad)
            x.grad = None  # a fresh gradient each step, not one accumulated into

        return run

    keyed = count_step(step(lambda x: dropout_mod.keyed_dropout(x, p, 1, True)), lambda: dropout_mod.samples(keys))
    return keyed, count_step(step(lambda x: F.dropout(x, p, True)))


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="H100", help="a device name of gpus.py, e.g. H100 (SXM), 'H100 PCIe', A100, H200")
    p.add_argument(
        "--only", action="append", metavar="FAMILY", help="these families only (model.arch names; repeatable)"
    )
    p.add_argument("--tiny", action="store_true", help="tiny sizes (seq 64, batch 2, vocab 512): checks the script")
    p.add_argument("--dropout", type=float, help="model.dropout for every family (default: each family's)")
    p.add_argument("--attention-dropout", type=float, help="model.attention_dropout (default: each family's)")
    p.add_argument("--mask-share", type=float, default=0.15, help="share of True in a boolean mask (default 0.15)")
    p.add_argument("--top", type=int, default=8, help="ops listed per family, by the larger estimated time")
    p.add_argument("--launch-us", type=float, default=3.0, help="per-kernel launch cost of the +launch column")
    p.add_argument("--project", type=Path, help="an already generated project (its src/<package> is imported)")
    return p.parse_args(argv)


def pick_gpu(name: str):
    gpus = load_gpus()
    gpu = next((g for g in gpus if g.device_name.lower() == name.lower()), None)
    if gpu is None:
        raise SystemExit(f"--gpu {name!r} is not in gpus.py; use one of {', '.join(g.device_name for g in gpus)}")
    if getattr(gpu, "bandwidth", None) is None:
        raise SystemExit(f"gpus.py gives {gpu.device_name} no memory bandwidth")
    return gpu


@dataclass
class Compared:
    run: Run
    tallies: dict[str, Tally]  # "ours", "peer"
    labels: dict[str, str]
    dropout: tuple[float, float]  # hidden, attention
    note: str  # what the peer lacks of ours' dropout
    sites: list[tuple[str, tuple[int, ...], float]]  # dropout sites: name, shape, p
    seconds: float


def compare(run: Run, project, args: argparse.Namespace) -> Compared:
    started = time.perf_counter()
    models, config_mod, dropout_mod, family_mod = project
    fam = family_mod.family(run.arch)
    cfg, ours = build_ours(models, config_mod, run, args.dropout, args.attention_dropout)
    peer = build_peer(ours, fam)
    ids, targets = batch(run, fam.causal, args.mask_share)
    keys = dropout_mod.sample_keys(1337, 0, 0, run.batch, device="meta")  # the trainer's samples(...) per micro batch
    tallies = {
        "ours": count_step(
            step_of(ours, ids, targets, False), partial(dropout_mod.samples, keys), args.mask_share, ours
        ),
        "peer": count_step(step_of(peer, ids, targets, True), mask_share=args.mask_share, model=peer),
    }
    hidden_p, attention_p = dropout_of(ours, fam, cfg.model, dropout_mod)
    shape = fam.shape(run.size)
    sites = [(f"{run.name} hidden", (run.batch, run.seq, shape["n_embd"]), hidden_p or 0.1)]
    if fam.attention_dropout:
        probs = (run.batch, shape["n_head"], run.seq, run.seq)
        sites.append((f"{run.name} attention probs", probs, attention_p or 0.1))
    # a peer without dropout layers (NanoChat) runs ours' hidden dropout nowhere
    undropped = hidden_p and not any(isinstance(m, torch.nn.Dropout) for m in peer.modules())
    note = f"; {type(peer).__name__} has no hidden dropout" if undropped else ""
    labels = {"ours": f"ours {run.name}", "peer": f"peer {type(peer).__name__}"}
    return Compared(run, tallies, labels, (hidden_p, attention_p), note, sites, time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    gpu = pick_gpu(args.gpu)
    peak, bandwidth = gpu.peak("bf16"), gpu.bandwidth
    if args.project is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpt_vs_hf import render_project

        args.project = Path(tempfile.mkdtemp(prefix="gpu-estimate-")) / "project"
        render_project(args.project, "HEAD", every_part=True)
    project = import_project(args.project)
    known = project[3].families()
    if unknown := sorted(set(args.only or ()) - set(known)):
        raise SystemExit(f"--only {', '.join(unknown)}: not a model family; use one of {', '.join(known)}")
    runs = [r for r in (TINY_RUNS if args.tiny else DEFAULT_RUNS) if not args.only or r.arch in args.only]
    if not runs:
        rows_of = sorted({r.arch for r in DEFAULT_RUNS})
        raise SystemExit(f"--only {', '.join(args.only)}: no row here; the rows are of {', '.join(rows_of)}")

    print(
        f"{gpu.device_name}: {peak / 1e12:.0f} TFLOP/s bf16, {bandwidth / 1e12:.2f} TB/s. One micro batch "
        "(forward, loss, backward), eager, bf16 weights; per kernel max(FLOPs/peak, bytes/bandwidth)."
    )
    print(
        f"{'model':<34} {'batch':>9} {'GFLOP':>9} {'GB':>8} {'kernels':>8} {'est ms':>9} "
        f"{'matmul ms':>10} {'est/mm':>7} {'+launch ms':>11}"
    )
    results = []
    for run in runs:
        results.append(compare(run, project, args))
        for who, tally in results[-1].tallies.items():
            est, mm, n = tally.time_s(peak, bandwidth), tally.matmul_s(peak), len(tally.kernels)
            print(
                f"{results[-1].labels[who]:<34} {f'{run.batch}x{run.seq}':>9} {tally.flops / 1e9:9.0f} "
                f"{tally.bytes / 1e9:8.2f} {n:8d} {est * 1e3:9.2f} {mm * 1e3:10.2f} {est / mm:7.2f} "
                f"{(est + n * args.launch_us * 1e-6) * 1e3:11.2f}"
            )

    for result in results:
        hidden_p, attention_p = result.dropout
        head = []
        for who, tally in result.tallies.items():
            head_s, step_s = tally.head_s(peak, bandwidth), tally.time_s(peak, bandwidth)
            head.append(f"{who} {head_s * 1e3:.3g} ms ({100 * head_s / step_s:.0f}% of its step)")
        print(
            f"\n{result.run.name}: dropout hidden {hidden_p:g}, attention {attention_p:g}{result.note}; "
            f"counted in {result.seconds:.1f} s.\n  Head and loss (after the last block, forward and backward): "
            f"{', '.join(head)}. The ops that take longest:"
        )
        ops = {who: t.by_name(peak, bandwidth) for who, t in result.tallies.items()}
        longest = sorted(
            set(ops["ours"]) | set(ops["peer"]), key=lambda n: -max(o.get(n, (0, 0))[0] for o in ops.values())
        )
        print(f"  {'op':<36} {'ours ms':>9} {'kernels':>8} {'peer ms':>9} {'kernels':>8}")
        for name in longest[: args.top]:
            (o_s, o_n), (p_s, p_n) = ops["ours"].get(name, (0, 0)), ops["peer"].get(name, (0, 0))
            print(f"  {name:<36} {o_s * 1e3:9.3f} {o_n:8d} {p_s * 1e3:9.3f} {p_n:8d}")

    print("\nOne dropout site, forward + backward (bf16): ours keyed per sample vs torch's (goal <= 1.2x)")
    print(
        f"  {'site':<28} {'shape':>18} {'p':>5} {'ours k':>7} {'ours MB':>9} {'torch k':>8} {'torch MB':>9} "
        f"{'bytes x':>8} {'kernels x':>10} {'time x':>7}"
    )
    for name, shape, p in (site for result in results for site in result.sites):
        keyed, fused = dropout_site(project[2], shape, p)
        keyed_s, fused_s = keyed.time_s(peak, bandwidth), fused.time_s(peak, bandwidth)
        print(
            f"  {name:<28} {'x'.join(map(str, shape)):>18} {p:5.2f} {len(keyed.kernels):7d} {keyed.bytes / 1e6:9.1f} "
            f"{len(fused.kernels):8d} {fused.bytes / 1e6:9.1f} {keyed.bytes / fused.bytes:8.2f} "
            f"{len(keyed.kernels) / len(fused.kernels):10.2f} {keyed_s / fused_s:7.2f}"
        )
    print()
    for result in results:
        ours_s, peer_s = (t.time_s(peak, bandwidth) for t in result.tallies.values())
        print(
            f"family {result.run.name}: ours {ours_s * 1e3:.4g} ms, peer {peer_s * 1e3:.4g} ms, "
            f"ours/peer {ours_s / peer_s:.3f}"
        )


if __name__ == "__main__":
    main()
