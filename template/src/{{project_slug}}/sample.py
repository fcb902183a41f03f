"""Generate text from a trained checkpoint with a KV cache.

    <package> sample --prompt "The module" --max-new-tokens 100 --temperature 0.8
"""

from __future__ import annotations

from pathlib import Path

import torch

from .config import Config
from .data import bos_id, load_tokenizer, read_meta
from .distributed import autocast_context, pick_device
from .evaluate import load_trained_model


def run_sample(cfg: Config, prompts: list[str], max_new_tokens: int, temperature: float, top_k: int | None,
               seed: int, ckpt: str | None = None) -> list[str]:
    device = pick_device(cfg.run.device, 0)
    model, step, path, cfg = load_trained_model(cfg, ckpt, device)
    model.eval()
    data_dir = Path(cfg.data.dir)
    tok = load_tokenizer(data_dir / read_meta(data_dir)["tokenizer"])
    generator = torch.Generator(device=device).manual_seed(seed)
    print(f"sampling from {path} (step {step})", flush=True)
    texts = []
    for prompt in prompts:
        ids = [bos_id(tok), *tok.encode(prompt, add_special_tokens=False).ids]
        with autocast_context(device, cfg.run.dtype):
            new = model.generate(ids, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
        text = prompt + tok.decode(new)
        texts.append(text)
        print(f"--- {prompt!r}\n{text}\n", flush=True)
    return texts
