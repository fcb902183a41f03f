"""Training throughput of the template's GPT against transformers' GPT2LMHeadModel.

Renders a real project from this template with copier (or uses one given with --project), builds
its GPT and a `transformers` GPT2LMHeadModel of the same size (layers, width, heads, vocab,
sequence length, batch), and trains both in this one process on the same random token batches
with the same optimizer (AdamW, same lr, same gradient clipping). Warmup steps are not timed; the
timed steps run in rounds whose order alternates (ours, HF / HF, ours, ...) so that neither model
profits from a warmer machine, and the table shows medians over the rounds: ms/step, tokens/s,
achieved FLOP/s and, on CUDA, MFU. The last line is the ratio ours/HF of tokens/s.

Both models are counted with the same FLOPs-per-token formula, 6 x matmul parameters
+ 12 x layers x heads x head_dim x sequence length. Matmul parameters are all parameters minus
the embedding tables, plus the output head: for our GPT that is model.flops_per_token()
(everything but wte; the head is a separate matrix), for GPT-2 everything but wte and wpe, plus
the head, which is tied to wte.

The models are not identical. GPT-2 has biases, LayerNorm with a learned gain and bias, GELU,
learned absolute positions and a head tied to the token embedding; ours has RMSNorm without
parameters, ReLU^2, rotary positions, QK-norm, a logit softcap and an untied head. So the
parameter counts differ slightly; both are printed. GPT-2 runs with attn_implementation="sdpa"
so both use F.scaled_dot_product_attention, dropout 0 and use_cache=False.

CPU (default small size, a few minutes on 2 cores; fp32, no MFU):

    export PATH=/work/venv/bin:$PATH          # torch, transformers, copier
    python bench/gpt_vs_hf.py

GPU (bf16 autocast, TF32 matmuls, MFU from the project's metrics.peak_flops), e.g. nanochat d12:

    python bench/gpt_vs_hf.py --size d12 --vocab 50304 --seq 1024 --batch 16 --steps 60 --compile

Other options: --layers/--width/--heads instead of --size, --warmup, --rounds, --lr, --seed,
--device, --verbose (ms/step of every round), --project PATH (an already generated project, e.g.
on a machine without copier or git history), --vcs-ref (the template revision copier renders;
with the default HEAD copier also includes uncommitted template changes).
This is a script run by hand, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEMPLATE_ROOT = Path(__file__).resolve().parent.parent
# project_name "bench" would give the package `bench`, which clashes with this bench/ folder when
# the script is run as `python -m bench.gpt_vs_hf` from the template root; "benchgpt" does not.
PROJECT_NAME = "benchgpt"

NOTE = (
    "note: GPT-2 has biases, LayerNorm (gain+bias), GELU, learned positions and a tied head; ours has RMSNorm\n"
    "      without parameters, ReLU^2, rotary, QK-norm, logit softcap and an untied head, so the parameter\n"
    "      counts differ slightly. FLOPs/token = 6 x matmul params + 12 x L x H x hd x T for both\n"
    "      (matmul params = all minus embedding tables, plus the output head; GPT-2's head is tied to wte)."
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--size",
        help="size name resolved by the project's models.family.model_shape: 'tiny' or 'd<depth>' "
        "(overrides --layers/--width/--heads; kv heads are set equal to heads, GPT-2 has no GQA)",
    )
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=256, help="sequence length")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps per model (split into --rounds)")
    p.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="timed rounds per model; the order alternates each round (more rounds = finer interleaving)",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model before the rounds")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="global norm clipping for both; 0 disables")
    p.add_argument("--softcap", type=float, default=15.0, help="our GPT's logit softcap (the template default)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--compile", action="store_true", help="torch.compile both models")
    p.add_argument("--verbose", action="store_true", help="also print ms/step of every round")
    p.add_argument("--project", type=Path, help="an already generated project (its src/<slug>/ is imported)")
    p.add_argument(
        "--vcs-ref",
        default="HEAD",
        help="template revision copier renders (default HEAD, uncommitted changes included)",
    )
    args = p.parse_args(argv)
    for name in ("layers", "width", "heads", "vocab", "seq", "batch", "steps", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must not be negative")
    return args


# ---------------------------------------------------------------------------
# The generated project
# ---------------------------------------------------------------------------


def render_project(dst: Path, vcs_ref: str, every_part: bool = False) -> None:
    """A project of this template at vcs_ref (the default answers). every_part: with every family's
    folder and DeepSpeed's copied in too, for the benches that compare them all in one project (a
    project holds only its own family, gpt's and, for strategy=deepspeed, DeepSpeed's)."""
    if importlib.util.find_spec("copier") is not None:
        copier = [sys.executable, "-m", "copier"]
    elif shutil.which("copier"):
        copier = [shutil.which("copier")]
    else:
        raise RuntimeError("copier is not installed (pip install copier), or pass --project PATH")
    git = subprocess.run(
        ["git", "-C", str(TEMPLATE_ROOT), "status", "--porcelain", "--", "copier.yml", "template"],
        capture_output=True,
        text=True,
    )
    if vcs_ref == "HEAD" and git.returncode == 0 and git.stdout.strip():
        print("note: the template has uncommitted changes; copier --vcs-ref HEAD renders them too")
    cmd = [
        *copier,
        "copy",
        "--trust",
        "--defaults",
        "--quiet",
        "--vcs-ref",
        vcs_ref,
        "--data",
        f"project_name={PROJECT_NAME}",
        str(TEMPLATE_ROOT),
        str(dst),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    if every_part:  # the folders hold no Jinja but their README parts (left out, as copier does)
        package = TEMPLATE_ROOT / "template" / "src" / "{{project_slug}}"
        target = next((dst / "src").glob("*/cli.py")).parent
        families = [folder for folder in (package / "models").iterdir() if folder.is_dir()]
        for part in [*families, package / "strategies" / "deepspeed"]:
            if part.is_dir() and not (target / part.relative_to(package)).exists():
                shutil.copytree(
                    part,
                    target / part.relative_to(package),
                    ignore=shutil.ignore_patterns("*.jinja", "__pycache__"),
                )


def import_project(project: Path):
    """The generated package's models.gpt.model, models.family and training.metrics modules."""
    found = sorted((project / "src").glob("*/models/gpt/model.py"))
    if len(found) != 1:
        raise RuntimeError(
            f"expected exactly one src/<package>/models/gpt/model.py under {project}, found {len(found)}"
        )
    src, slug = found[0].parents[3], found[0].parents[2].name  # src/<slug>/models/gpt/model.py
    if slug in sys.modules:
        raise RuntimeError(
            f"a module named {slug!r} is already imported ({sys.modules[slug]!r}); "
            "generate the project under another name"
        )
    sys.path.insert(0, str(src))
    mods = [
        importlib.import_module(f"{slug}.{name}") for name in ("models.gpt.model", "models.family", "training.metrics")
    ]
    origin = Path(sys.modules[slug].__file__).resolve().parent
    if origin != (src / slug).resolve():
        raise RuntimeError(f"import {slug} found {origin}, not {src / slug}: a name clash on sys.path")
    return slug, *mods


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


def flops_per_token(matmul_params: int, n_layer: int, n_head: int, head_dim: int, seq: int) -> int:
    return 6 * matmul_params + 12 * n_layer * n_head * head_dim * seq


def build_ours(gpt_mod, shape: dict, vocab: int, seq: int, softcap: float):
    cfg = gpt_mod.GPTConfig(vocab_size=vocab, sequence_len=seq, softcap=softcap, **shape)
    model = gpt_mod.GPT(cfg)
    model.init_weights()
    n_params = sum(p.numel() for p in model.parameters())
    matmul = n_params - model.wte.weight.numel()
    fpt = model.flops_per_token()
    shared = flops_per_token(matmul, cfg.n_layer, cfg.n_head, cfg.head_dim, seq)
    if fpt != shared:
        print(f"warning: GPT.flops_per_token()={fpt:,} differs from the shared formula {shared:,}")
    return model, n_params, fpt


def build_hf(shape: dict, vocab: int, seq: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=vocab,
        n_positions=seq,
        n_embd=shape["n_embd"],
        n_layer=shape["n_layer"],
        n_head=shape["n_head"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="sdpa",
    )
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # what it falls back to anyway, without the warning
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"GPT-2 attention is {model.config._attn_implementation!r}, not sdpa")
    n_params = sum(p.numel() for p in model.parameters())  # the tied head is counted once, as wte
    wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
    matmul = n_params - wte.numel() - wpe.numel() + model.lm_head.weight.numel()
    fpt = flops_per_token(matmul, shape["n_layer"], shape["n_head"], shape["n_embd"] // shape["n_head"], seq)
    return model, n_params, fpt


class Contender:
    def __init__(self, name, model, n_params, fpt, loss_fn, args, device):
        import torch

        self.name, self.model, self.n_params, self.flops_per_token = name, model, n_params, fpt
        model.to(device).train()
        self.runnable = torch.compile(model) if args.compile else model
        self.loss_fn = loss_fn
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=args.lr,
            betas=(0.9, 0.95),
            weight_decay=args.weight_decay,
            fused=device.type == "cuda",
        )
        self.grad_clip = args.grad_clip
        self.round_seconds: list[float] = []
        self.losses: list[float] = []

    def steps(self, batches, autocast_ctx):
        """Train on the batches; returns the last loss as a tensor (read after the clock stops), None if none."""
        import torch

        loss = None
        for x, y in batches:
            with autocast_ctx():
                loss = self.loss_fn(self.runnable, x, y)
            loss.backward()
            if self.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss


def ours_loss(model, x, y):
    return model(x, y)


def hf_loss(model, x, y):
    # Canonical HF usage: labels = input_ids, shifted inside the model (targets are y[:, :-1]; the
    # last position has no target). Same logits and cross-entropy work as ours.
    return model(input_ids=x, labels=x).loss


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        project = args.project
        if project is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpt_vs_hf_")))
            project = tmp / PROJECT_NAME
            try:
                render_project(project, args.vcs_ref)
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        try:
            slug, gpt_mod, family, metrics = import_project(project.resolve())
        except (RuntimeError, ImportError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return run(args, slug, gpt_mod, family, metrics)


def run(args, slug, gpt_mod, family, metrics) -> int:
    import torch
    import transformers

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    if args.size:
        try:
            shape = family.model_shape(args.size, None)
        except AttributeError:  # re.fullmatch found nothing
            print(f"error: --size {args.size!r} is neither 'tiny' nor 'd<depth>'", file=sys.stderr)
            return 2
        shape["n_kv_head"] = shape["n_head"]  # GPT-2 has no grouped-query attention
    else:
        shape = {"n_layer": args.layers, "n_embd": args.width, "n_head": args.heads, "n_kv_head": args.heads}
    if min(shape.values()) < 1:
        print(f"error: the shape {shape} needs at least 1 layer, width and head", file=sys.stderr)
        return 2
    head_dim = shape["n_embd"] // shape["n_head"]
    if shape["n_embd"] % shape["n_head"] or head_dim % 2:
        print(
            f"error: width {shape['n_embd']} / {shape['n_head']} heads must be an even integer head dim",
            file=sys.stderr,
        )
        return 2

    per_round = max(1, args.steps // args.rounds)
    timed = per_round * args.rounds
    B, T, V = args.batch, args.seq, args.vocab
    tokens_per_step = B * T

    # The same batches for both: step i of either model trains on batch i.
    gen = torch.Generator().manual_seed(args.seed)
    batches = []
    for _ in range(args.warmup + timed):
        buf = torch.randint(0, V, (B, T + 1), generator=gen)
        batches.append((buf[:, :-1].contiguous().to(device), buf[:, 1:].contiguous().to(device)))

    torch.manual_seed(args.seed)
    ours = Contender(
        f"ours ({slug}.models.gpt.model.GPT)", *build_ours(gpt_mod, shape, V, T, args.softcap), ours_loss, args, device
    )
    torch.manual_seed(args.seed)
    hf = Contender("HF GPT2LMHeadModel (sdpa)", *build_hf(shape, V, T), hf_loss, args, device)
    contenders = [ours, hf]

    bf16 = cuda

    def autocast_ctx():
        return torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    threads = f" ({torch.get_num_threads()} threads)" if not cuda else f" ({torch.cuda.get_device_name(device)})"
    print(
        f"device {device.type}{threads} | {'bf16 autocast' if bf16 else 'fp32'} | compile "
        f"{'on' if args.compile else 'off'} | torch {torch.__version__} | transformers {transformers.__version__}"
    )
    size = f"size {args.size}: " if args.size else ""
    print(
        f"{size}{shape['n_layer']} layers, width {shape['n_embd']}, {shape['n_head']} heads of {head_dim} "
        f"| vocab {V} | seq {T} | batch {B} = {tokens_per_step:,} tokens/step"
    )
    print(
        f"AdamW lr {args.lr:g} wd {args.weight_decay:g} clip {args.grad_clip:g} | {args.warmup} warmup steps each, "
        f"then {args.rounds} rounds x {per_round} timed steps each, order alternating"
    )

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    t_start = time.perf_counter()
    for c in contenders:  # warmup (compilation included with --compile); not timed
        loss = c.steps(batches[: args.warmup], autocast_ctx)
        if loss is not None:
            c.losses.append(loss.item())
    for r in range(args.rounds):
        order = contenders if r % 2 == 0 else contenders[::-1]
        chunk = batches[args.warmup + r * per_round : args.warmup + (r + 1) * per_round]
        for c in order:
            sync()
            t0 = time.perf_counter()
            loss = c.steps(chunk, autocast_ctx)
            sync()
            c.round_seconds.append(time.perf_counter() - t0)
            c.losses.append(loss.item())
    wall = time.perf_counter() - t_start

    peak = metrics.peak_flops(device)
    unit, scale = ("TFLOP/s", 1e12) if cuda else ("GFLOP/s", 1e9)
    header = f"{'model':<34} {'params':>12} {'MFLOP/tok':>10} {'ms/step':>9} {'tokens/s':>11} {unit:>8}"
    if cuda:
        header += f" {'MFU':>6}"
    header += f" {'loss':>7}"
    print()
    print(header)
    print("-" * len(header))
    tps = {}
    for c in contenders:
        step_s = statistics.median(c.round_seconds) / per_round
        ms, tps[c.name] = 1000 * step_s, tokens_per_step / step_s
        achieved = c.flops_per_token * tps[c.name]
        line = (
            f"{c.name:<34} {c.n_params:>12,} {c.flops_per_token / 1e6:>10.1f} {ms:>9.1f} {tps[c.name]:>11,.0f} "
            f"{achieved / scale:>8.1f}"
        )
        if cuda:
            m = metrics.mfu(c.flops_per_token, tps[c.name], 1, peak)
            line += f" {'n/a' if m is None else f'{100 * m:.1f}%':>6}"
        line += f" {c.losses[-1]:>7.3f}"
        print(line)
        if not all(math.isfinite(x) for x in c.losses):
            print(f"warning: {c.name} produced a non-finite loss: {c.losses}")
    if args.verbose:
        for c in contenders:
            per_step = " ".join(f"{1000 * s / per_round:.1f}" for s in c.round_seconds)
            print(f"{c.name:<34} ms/step per round: {per_step}")
    per_round_ratio = [h / o for o, h in zip(ours.round_seconds, hf.round_seconds)]
    print()
    print(
        f"ratio ours/HF tokens/s: {tps[ours.name] / tps[hf.name]:.3f}x of the medians | paired rounds: median "
        f"{statistics.median(per_round_ratio):.3f}x, range {min(per_round_ratio):.3f}-{max(per_round_ratio):.3f}"
    )
    print(f"loss = last step; random tokens cannot be learnt, ln(vocab) = {math.log(V):.3f}")
    if cuda and peak is None:
        print(f"MFU n/a: no peak FLOP/s known for {torch.cuda.get_device_name(device)} in the project's gpus.py")
    print(NOTE)
    print(f"bench wall time (warmup + timed, both models): {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
