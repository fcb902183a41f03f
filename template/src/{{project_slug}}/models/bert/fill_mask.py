"""`sample` for bert (its descriptor's sampler): the likeliest tokens for each [MASK] of a prompt.

    <package> sample --prompt "The capital of France is [MASK]." --top-k 5

BERT reads a prompt whole, between [CLS] and [SEP], so one longer than its context is refused.
"""

from __future__ import annotations

import torch

from ...settings.config import ConfigError

MASK = "[MASK]"


@torch.no_grad()
def fill_mask(model, tok, prompt: str, top_k: int, device: torch.device, autocast, context: int) -> str:
    """Print the top_k predictions (with probabilities) for each [MASK] of the prompt; return the
    prompt with every [MASK] replaced by its most likely token. A prompt without [MASK] gets one
    appended, so `sample` with the default prompt shows something. autocast: the run's precision's context."""
    if MASK not in prompt:
        prompt = f"{prompt} {MASK}"
    ids = tok.encode(prompt, add_special_tokens=False).ids
    mask_id = tok.token_to_id(MASK)
    ids = [tok.token_to_id("[CLS]"), *ids, tok.token_to_id("[SEP]")]
    if len(ids) > context:
        raise ConfigError(
            f"--prompt is {len(ids)} tokens with [CLS] and [SEP]; this BERT reads at most {context} "
            "(model.sequence_len): shorten the prompt"
        )
    with autocast:
        logits = model(torch.tensor([ids], device=device))[0].float()
    probs = logits.softmax(dim=-1)
    print(f"--- {prompt!r}", flush=True)
    filled = list(ids)
    for n, pos in enumerate(i for i, t in enumerate(ids) if t == mask_id):
        top = probs[pos].topk(min(top_k, probs.size(-1)))
        guesses = [(tok.id_to_token(int(i)), float(p)) for p, i in zip(top.values, top.indices)]
        print(f"[MASK] {n + 1}: " + " | ".join(f"{word} {p:.3f}" for word, p in guesses), flush=True)
        filled[pos] = int(top.indices[0])
    text = tok.decode(filled[1:-1])
    print(f"{text}\n", flush=True)
    return text
