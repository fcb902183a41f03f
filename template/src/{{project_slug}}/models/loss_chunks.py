"""The chunked loss's sizes (models/lm_loss.py runs with them) and what it holds at its peak, without
torch: `plan` prices the loss from the very constants the loss computes with. It imports nothing, so
an export that carries lm_loss.py as modeling code carries this file beside it.
"""

# fp32 logits per chunk (128 MiB; vocab 32768: 1024 tokens, a matmul that still fills a GPU). Eager
# holds about four fp32 copies of a chunk at its peak (softcap, log-softmax, gradient): ~0.5 GB
# whatever the micro batch.
CHUNK_LOGITS = 2**25
CHUNK_BYTES_PER_LOGIT = 16  # those four fp32 copies
# Chunks whose logits' gradients (in the matmul's dtype: 256 MiB in bf16) go through one matmul into
# the head's fp32 gradient, which is read and written once per such group (vocab x width x 10 bytes):
# at width 2048 that costs as much as one chunk's elementwise work, so a group of four pays a quarter
# of it per chunk.
CHUNKS_PER_HEAD_GRADIENT = 4


def chunked_loss_bytes(width: int, rows: int, tokens: int, matmul_bytes: int = 2) -> float:
    """What the chunked loss holds at its peak for a micro batch of `tokens` positions: the two
    gradients forward computes and keeps for backward (the hidden states', tokens x width in the
    matmul's dtype; the head's, rows x width in fp32), one chunk's transients, a group of chunks'
    logit gradients in the matmul's dtype, and their product into the head's gradient before it is
    added in."""
    kept = tokens * width * matmul_bytes + rows * width * 4
    chunk = CHUNK_LOGITS * (CHUNK_BYTES_PER_LOGIT + CHUNKS_PER_HEAD_GRADIENT * matmul_bytes)
    return kept + chunk + rows * width * matmul_bytes
