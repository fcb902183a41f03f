"""The language-model loss without the whole logits: a chunked linear cross-entropy.

cross_entropy(softcap(hidden @ weight[:vocab].T), targets) over N tokens holds N x vocab fp32 logits
and their copies: 4.3 GB each for a d20 micro batch of 16 x 2048 tokens at vocab 32768. Here the
tokens go through the head in chunks of about CHUNK_LOGITS logits. Each chunk's logits give its share
of the loss and, at once, its gradient with respect to them (softmax minus the one-hot target, times
the softcap's derivative 1 - tanh^2), which a matmul turns into the chunk's rows of the hidden
states' gradient, and another (one per few chunks) into a share of the head weight's, summed in fp32.
Forward keeps those two gradients (N x width in the matmul's dtype, the head's rows x width in fp32)
and drops the logits; backward only scales them by the loss's gradient (and 1 / tokens counted for
"mean"). This is the algorithm of Liger-Kernel's fused linear cross-entropy, in plain torch.

linear_cross_entropy() takes this path where a gradient will be asked for (grad mode on, an input
that requires one) and the loss is one number (reduction "mean" or "sum"); otherwise (evaluation, a
loss per token) it computes the whole logits as before. Both give the same numbers within rounding.
On a GPU the model is compiled whole (run.compile), this function included: softmax_cross_entropy
is a pure function, which Inductor fuses into a few kernels per chunk.

Imports torch and loss_chunks.py only: gpt.py imports it, and an export carries gpt.py with the files
it imports.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from .loss_chunks import CHUNK_LOGITS, CHUNKS_PER_HEAD_GRADIENT  # their sizes and why: loss_chunks.py


def chunk_rows(vocab_size: int) -> int:
    """Tokens per chunk: as many as keep a chunk's logits within CHUNK_LOGITS (at least one)."""
    return max(1, CHUNK_LOGITS // vocab_size)


def capped_logits(logits: torch.Tensor, softcap: float) -> torch.Tensor:
    """The head's output as the loss sees it: fp32, squashed into (-softcap, softcap) (0: as is)."""
    logits = logits.float()
    if softcap > 0:
        logits = softcap * torch.tanh(logits / softcap)
    return logits


def softmax_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, softcap: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's elementwise part: logits (rows, vocab) as the matmul gave them, targets (rows,),
    -1 ignored -> (the sum of the counted tokens' losses in fp32, d(loss of each row) / d(logits)
    computed in fp32 and given in `dtype`, on every row: the caller drops the ignored ones). Pure:
    its in-place ops write only tensors it made, and nothing is read on the host."""
    if softcap > 0:
        capped = logits.to(torch.float32, copy=True).div_(softcap).tanh_()
        logp = torch.log_softmax(capped * softcap, dim=-1)
    else:
        logp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    counted = targets != -1
    safe = torch.where(counted, targets, 0).unsqueeze(1)  # an index gather accepts, on ignored rows too
    loss = -torch.where(counted, logp.gather(1, safe).squeeze(1), 0.0).sum()
    grad = logp.exp_()  # the softmax
    grad.scatter_add_(1, safe, torch.full(safe.shape, -1.0, dtype=grad.dtype, device=grad.device))  # - one-hot
    if softcap > 0:  # x (1 - tanh^2), the softcap's derivative, written in `dtype` by the same kernel
        return loss, torch.addcmul(grad, grad, capped.square_(), value=-1, out=torch.empty_like(grad, dtype=dtype))
    return loss, grad.to(dtype)


class LinearCrossEntropy(torch.autograd.Function):
    """cross_entropy(capped_logits(hidden @ weight[:vocab_size].T), targets, reduction), its
    gradients computed chunk by chunk during forward. hidden (N, width); weight (rows >= vocab_size,
    width), rows past vocab_size padding (their gradient stays 0); targets (N,), -1 ignored; the matmuls in
    `dtype`, `rows` tokens at a time."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab_size, softcap, reduction, dtype, rows):
        ctx.hidden_dtype, ctx.weight_dtype = hidden.dtype, weight.dtype
        need_hidden, need_weight = ctx.needs_input_grad[:2]
        device = hidden.device.type
        # The matmuls in `dtype` as given (autocast's, if it was on), whatever autocast would pick per op.
        plain = torch.autocast(device, enabled=False) if _has_autocast(device) else contextlib.nullcontext()
        with plain:
            h, w = hidden.to(dtype), weight[:vocab_size].to(dtype)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_hidden = torch.empty_like(h) if need_hidden else None
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
            # An ignored token adds nothing: its rows are dropped on the (tokens x width) side, not the logits'.
            ignored = (targets == -1).unsqueeze(1)
            group = rows * CHUNKS_PER_HEAD_GRADIENT
            for first in range(0, h.size(0), group):
                last = min(first + group, h.size(0))
                grads = torch.empty(last - first, vocab_size, dtype=dtype, device=h.device)
                for start in range(first, last, rows):
                    end = min(start + rows, last)
                    loss, grad = softmax_cross_entropy(h[start:end] @ w.t(), targets[start:end], softcap, dtype)
                    total = total + loss
                    grads[start - first : end - first] = grad
                    if need_hidden:
                        grad_hidden[start:end] = (grad @ w).masked_fill_(ignored[start:end], 0)
                if need_weight:  # summed in fp32 (in the matmul itself where that runs in fp32)
                    counted_rows = h[first:last].masked_fill(ignored[first:last], 0)
                    if dtype == torch.float32:
                        grad_weight[:vocab_size].addmm_(grads.t(), counted_rows)
                    else:
                        grad_weight[:vocab_size].add_(grads.t() @ counted_rows)
            # "mean" divides by the tokens counted, as F.cross_entropy does; with none counted the loss
            # is NaN there and every gradient 0, and here too (the gradients divide by at least 1).
            counted = (targets != -1).sum()
            divisor = counted.clamp(min=1).float() if reduction == "mean" else None
            loss = total / counted if reduction == "mean" else total
        ctx.save_for_backward(grad_hidden, grad_weight, divisor)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, divisor = ctx.saved_tensors
        scale = grad_loss if divisor is None else grad_loss / divisor  # in fp32
        if grad_hidden is not None:  # a copy: backward may run again on the saved tensors (retain_graph)
            grad_hidden = grad_hidden.to(ctx.hidden_dtype, copy=True).mul_(scale)
        if grad_weight is not None:
            grad_weight = (grad_weight * scale).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None


def _has_autocast(device: str) -> bool:
    return torch.amp.is_autocast_available(device)  # not on the meta device (bench/gpu_estimate.py)


def matmul_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype nn.Linear would multiply in here: autocast's where it is on, else the input's."""
    device = hidden.device.type
    if _has_autocast(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden.dtype


def chunked(reduction: str, *inputs: torch.Tensor) -> bool:
    """Whether linear_cross_entropy takes the chunked path: one loss, and a gradient to come."""
    return reduction in ("mean", "sum") and torch.is_grad_enabled() and any(t.requires_grad for t in inputs)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    softcap: float = 0.0,
    reduction: str = "mean",
    rows: int | None = None,
) -> torch.Tensor:
    """F.cross_entropy(capped_logits((hidden @ weight.T)[:, :vocab_size]), targets, ignore_index=-1,
    reduction=reduction); chunked, `rows` tokens at a time (default chunk_rows), where chunked() says
    so. hidden (..., width) and targets (...) are flattened."""
    hidden, targets = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)
    if chunked(reduction, hidden, weight):
        rows = rows or chunk_rows(vocab_size)
        dtype = matmul_dtype(hidden)
        return LinearCrossEntropy.apply(hidden, weight, targets, vocab_size, float(softcap), reduction, dtype, rows)
    logits = capped_logits(F.linear(hidden, weight)[:, :vocab_size], softcap)
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction=reduction)
