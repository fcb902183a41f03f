"""Generate text from a trained checkpoint with a KV cache, or what the family's sampler makes of a
prompt where it continues none (a masked LM fills in its masks: models/<family>/ names it).

<package> sample --prompt "The module" --max-new-tokens 100 --temperature 0.8

Past the model's context (model.sequence_len) a causal model slides a window: each new token is
read from the last sequence_len tokens, and a longer prompt from its end (a note says so).

The text goes to stdout; the progress of a long generation to stderr (a tqdm bar on a terminal, a
line every PROGRESS_SECONDS elsewhere), so `sample ... > out.txt` holds the text alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from ..data.tokens import bos_id, data_tokenizer
from ..models.family import families, family
from ..runtime.distributed import autocast_context, one_process, pick_device
from ..runtime.run_context import resolve_run
from ..settings.bounds import ANY_TEXT, count, non_negative_float, non_negative_int
from ..settings.config import Config
from .trained_model import load_trained_model

PROGRESS_SECONDS = 10.0


@contextmanager
def generation_progress(model, total: int, every: float = PROGRESS_SECONDS):
    """Counts the tokens `model.generate` makes (one forward pass each) on stderr."""
    bar, started, printed, made = None, time.monotonic(), [time.monotonic()], [0]
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, desc="sampling", unit="token", file=sys.stderr, leave=False)
    else:
        print(f"sampling {total:,} tokens", file=sys.stderr, flush=True)

    def count(module, inputs, output):
        made[0] += 1
        if bar is not None:
            bar.update(1)
        elif time.monotonic() - printed[0] >= every:
            printed[0] = time.monotonic()
            print(f"sampling: {made[0]:,}/{total:,} tokens", file=sys.stderr, flush=True)

    hook = model.register_forward_hook(count)
    try:
        yield
    finally:
        hook.remove()
        if bar is not None:
            bar.close()
        else:
            rate = made[0] / max(time.monotonic() - started, 1e-9)
            print(f"sampled {made[0]:,}/{total:,} tokens ({rate:,.1f} tokens/s)", file=sys.stderr, flush=True)


def run_sample(
    cfg: Config,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int,
    ckpt: str | None = None,
) -> list[str]:
    device = pick_device(cfg.run.device, 0)
    model, step, path, cfg = load_trained_model(cfg, ckpt, device)
    run = resolve_run(cfg, one_process(device))  # the checkpoint's config on this device
    model.eval()
    data_dir = Path(cfg.data.dir)
    tok = data_tokenizer(data_dir)
    print(f"sampling from {path} (step {step})", flush=True)
    if not run.family.causal:
        top_k = top_k or run.family.sample_top_k
        return [
            run.family.sample(
                model, tok, prompt, top_k, device, autocast_context(device, run.precision), cfg.model.sequence_len
            )
            for prompt in prompts
        ]
    generator = torch.Generator(device=device).manual_seed(seed)
    texts = []
    context = cfg.model.sequence_len
    for prompt in prompts:
        ids = [bos_id(tok), *tok.encode(prompt, add_special_tokens=False).ids]
        if len(ids) > context:
            print(f"note: the prompt is {len(ids)} tokens; the model reads its last {context} (model.sequence_len)")
        elif len(ids) + max_new_tokens > context:
            print(f"note: past {context} tokens (model.sequence_len) each new one is read from the last {context}")
        with autocast_context(device, run.precision), generation_progress(model, max_new_tokens):
            new = model.generate(ids, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
        text = prompt + tok.decode(new)
        texts.append(text)
        print(f"--- {prompt!r}\n{text}\n", flush=True)
    return texts


def add_arguments(p: argparse.ArgumentParser) -> None:
    prompt = p.add_argument("--prompt", action="append", help='prompt text (repeatable; default: "The")')
    setattr(prompt, ANY_TEXT, True)  # a prompt may be empty or span lines
    p.add_argument("--max-new-tokens", type=count, default=64, help="causal models: tokens to generate (default 64)")
    p.add_argument("--temperature", type=non_negative_float, default=0.8, help="0 = greedy")
    p.add_argument(
        "--top-k",
        type=non_negative_int,
        help="causal models: sample among the k likeliest tokens (0 = all); masked: predictions shown per mask "
        f"(default: the family's, {', '.join(f'{f.name} {f.sample_top_k}' for f in families().values())})",
    )
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--checkpoint", help="checkpoint file or folder (default: latest)")


def run(cfg: Config, args: argparse.Namespace) -> int:
    top_k = args.top_k if args.top_k is not None else family(cfg.model.arch).sample_top_k
    run_sample(
        cfg, args.prompt or ["The"], args.max_new_tokens, args.temperature, top_k or None, args.seed, args.checkpoint
    )
    return 0
