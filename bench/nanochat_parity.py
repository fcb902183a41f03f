"""The gpt recipe's arithmetic against nanochat's own code: same weights, same batch, same steps.

vs_nanochat.py compares whole runs, where each side brings its own tokenizer, data order and
initialisation; this script takes all of that away. It builds nanochat's GPT and ours (the project's
model with every nanochat piece on, backout included) at one depth, copies nanochat's weights into
ours (nudged away from the initialisation, whose zero projections leave the scalars' gradients at
rounding level, which Adam would then blow up into full steps of either sign), and prints:
  - the loss on one batch of random tokens from each, and each parameter's gradient difference;
  - after each of --steps optimizer steps on that gradient (nanochat's MuonAdamW with the rates its
    base_train derives for this batch and depth; ours built by the project from train.yaml), the
    largest relative difference of any parameter, and which.
It passes when the losses agree to 1e-5 and nothing differs by more than --tolerance (rounding: the
two sum in different orders).

    python bench/nanochat_parity.py --nanochat /path/to/nanochat --depth 4 --batch-tokens 2048
    python bench/nanochat_parity.py --nanochat /path/to/nanochat --project /path/to/project --steps 5

Runs in seconds on a CPU, uncompiled (TORCHDYNAMO_DISABLE=1), fp32; nanochat's Python package is
imported from --nanochat (it needs torch only for its model and optimizer).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import types
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # nanochat compiles its optimizer kernels
sys.path.insert(0, str(Path(__file__).resolve().parent))

REFERENCE_BATCH = 2**19  # nanochat's base_train: the batch its rates are tuned at (d12)
REFERENCE_RATIO = 12  # its default --target-param-data-ratio: the horizon its weight decay scales with


def nanochat_config(ng, depth: int, vocab: int, seq: int):
    heads = max(1, depth * 64 // 128)  # nanochat's shape: width 64 x depth, heads of 128
    return ng.GPTConfig(sequence_len=seq, vocab_size=vocab, n_layer=depth, n_head=heads, n_kv_head=heads,
                        n_embd=depth * 64, window_pattern="L")  # fmt: skip


def nanochat_model(ng, depth: int, vocab: int, seq: int):
    model = ng.GPT(nanochat_config(ng, depth, vocab, seq))
    model.init_weights()
    return model


def scaling_params(ng, depth: int, vocab: int, seq: int) -> int:
    """nanochat's count for its horizons: the blocks' matrices and the head (on the meta device)."""
    import torch

    with torch.device("meta"):
        counts = ng.GPT(nanochat_config(ng, depth, vocab, seq)).num_scaling_params()
    return counts["transformer_matrices"] + counts["lm_head"]


def nanochat_optimizer(ng, model, depth: int, vocab: int, seq: int, batch_tokens: int):
    """The optimizer base_train builds: rates scaled by sqrt(batch / 2^19), weight decay by that and
    the d12 horizon over this depth's (both horizons REFERENCE_RATIO x scaling parameters)."""
    batch = math.sqrt(batch_tokens / REFERENCE_BATCH)
    decay = 0.28 * batch * scaling_params(ng, 12, vocab, seq) / scaling_params(ng, depth, vocab, seq)
    return model.setup_optimizer(unembedding_lr=0.008 * batch, embedding_lr=0.3 * batch, matrix_lr=0.02 * batch,
                                 weight_decay=decay, scalar_lr=0.5 * batch)  # fmt: skip


def our_name(name: str) -> str:
    return name.replace("transformer.wte.", "wte.").replace("transformer.h.", "blocks.")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nanochat", required=True, help="a checkout of nanochat")
    p.add_argument("--project", help="a project rendered from this template (default: rendered into --work)")
    p.add_argument("--work", default="/tmp/nanochat_parity")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--sequence", type=int, default=256)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest relative difference of a gradient or weight")
    args = p.parse_args()

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    sys.path.insert(0, args.nanochat)
    import nanochat.gpt as ng

    project = Path(args.project) if args.project else __import__("vs_nanochat").render_project(Path(args.work))
    src = project / "src"
    package = next(d.name for d in src.iterdir() if (d / "__init__.py").is_file())
    sys.path.insert(0, str(src))
    import importlib

    config = importlib.import_module(f"{package}.settings.config")
    family = importlib.import_module(f"{package}.models.family")
    build = importlib.import_module(f"{package}.models.gpt.build")
    optimizer = importlib.import_module(f"{package}.strategies.optimizer")

    rows = args.batch_tokens // args.sequence
    cfg = config.load_config(project / "config" / "train.yaml", [
        f"model.size=d{args.depth}", f"model.sequence_len={args.sequence}", f"data.vocab_size={args.vocab}",
        f"batch.global_batch_size={rows}", f"batch.micro_batch_size={rows}", "model.backout=true",
        "model.value_embeddings=true", "model.residual_scalars=true", "model.smear=true", "model.qk_scale=1.2",
        "model.window_pattern=L", "model.rotary_base=100000", "model.vocab_multiple=64", "optim.optimizer=muon",
    ])  # fmt: skip
    theirs = nanochat_model(ng, args.depth, args.vocab, args.sequence)
    with torch.no_grad():
        for tensor in theirs.parameters():
            tensor.add_(torch.randn_like(tensor) * (0.02 if tensor.ndim == 2 else 0.1))
    ours = build.build(cfg, args.vocab)
    mine = ours.state_dict()
    copied = {our_name(k): v for k, v in theirs.state_dict().items()}
    unmatched = sorted(set(mine) ^ set(copied))
    if unmatched:
        print(f"FAIL: parameters on one side only: {unmatched}")
        return 1
    ours.load_state_dict(copied)
    run = types.SimpleNamespace(cfg=cfg, device=torch.device("cpu"), family=family.family("gpt"), world_size=1, rank=0)
    opt_ours = optimizer.build_optimizer(ours, run)
    opt_theirs = nanochat_optimizer(ng, theirs, args.depth, args.vocab, args.sequence, args.batch_tokens)

    tokens = torch.randint(0, args.vocab, (rows, args.sequence + 1), generator=torch.Generator().manual_seed(1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    losses = [model(x, y) for model in (theirs, ours)]
    for loss in losses:
        loss.backward()
    print(f"loss: nanochat {losses[0].item():.6f}  ours {losses[1].item():.6f}")
    failed = abs(losses[0].item() - losses[1].item()) > 1e-5
    named = dict(ours.named_parameters())
    worst = 0.0
    for name, tensor in theirs.named_parameters():
        other = named[our_name(name)]
        rel = ((tensor.grad - other.grad).norm() / tensor.grad.norm().clamp_min(1e-30)).item()
        worst = max(worst, rel)
        if rel > args.tolerance:
            print(f"  gradient of {name}: relative difference {rel:.2e}")
            failed = True
    print(f"gradients: largest relative difference {worst:.2e}")
    for step in range(1, args.steps + 1):
        opt_theirs.step()
        opt_ours.step()
        mine = ours.state_dict()
        diffs = sorted(
            (((v - mine[our_name(k)]).norm() / v.norm().clamp_min(1e-30)).item(), k)
            for k, v in theirs.state_dict().items()
        )
        rel, name = diffs[-1]
        print(f"step {step}: largest relative weight difference {rel:.2e} ({name})")
        failed |= rel > args.tolerance
    print("FAIL" if failed else "PASS: the same arithmetic")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
