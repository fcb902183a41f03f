"""bench/gpu_estimate.py: its kernel accounting on the meta device, and the whole script at tiny sizes."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from conftest import TEMPLATE, run

SCRIPT = TEMPLATE / "bench" / "gpu_estimate.py"
FINAL_LINE = re.compile(r"^family (.+): ours ([0-9.e+-]+) ms, peer ([0-9.e+-]+) ms, ours/peer ([0-9.]+)$")


@pytest.fixture(scope="module")
def estimate():
    spec = importlib.util.spec_from_file_location("gpu_estimate_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.mark.quick
def test_attention_and_dropout_are_one_kernel_each_way_and_views_are_free(estimate):
    import torch
    import torch.nn.functional as F

    B, H, T, D = 2, 4, 128, 32
    q, k, v = (torch.empty(B, T, H, D, device="meta", requires_grad=True) for _ in range(3))

    def step():
        y = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        F.dropout(y.transpose(1, 2).reshape(B, T, H * D), 0.1, True).sum().backward()

    tally = estimate.count_step(step)
    names = [kernel.name for kernel in tally.kernels]
    # one flash kernel and one dropout kernel each way; the transposes and the reshape copy nothing
    assert names.count("flash_attention") == names.count("flash_attention_backward") == 1
    assert names.count("native_dropout") == names.count("native_dropout_backward") == 1
    assert not {"aten.bmm", "aten._softmax", "aten.bernoulli_", "aten.clone", "aten.transpose"} & set(names)
    forward = next(kernel for kernel in tally.kernels if kernel.name == "flash_attention")
    backward = next(kernel for kernel in tally.kernels if kernel.name == "flash_attention_backward")
    assert forward.flops == 4 * B * H * T * T * D / 2  # causal: half the scores
    assert backward.flops == 2.5 * forward.flops
    assert backward.bytes > forward.bytes > 4 * q.numel() * q.element_size()
    peak, bandwidth = 989e12, 3.35e12
    assert tally.time_s(peak, bandwidth) >= tally.matmul_s(peak) > 0


@pytest.mark.quick
def test_an_indexed_read_counts_the_elements_it_touches_and_the_head_is_summed_apart(estimate):
    import torch

    B, WIDTH, VOCAB = 4, 8, 100
    blocks = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(2))
    head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
    model = torch.nn.ModuleDict({"blocks": blocks, "head": head}).to("meta")
    x = torch.empty(B, WIDTH, device="meta")
    index = torch.zeros(B, 1, dtype=torch.long, device="meta")

    def step():
        h = blocks[1](blocks[0](x))
        head(h).log_softmax(-1).gather(1, index).sum().backward()

    tally = estimate.count_step(step, model=model)
    gather = next(kernel for kernel in tally.kernels if kernel.name == "aten.gather")
    assert gather.bytes == B * 8 + 2 * B * 4  # the index, and one element read and written per row
    # the head's matmul forward and its two backward ones are the head's; the blocks' are not
    head_flops = sum(kernel.flops for kernel in tally.kernels if kernel.head)
    assert head_flops == 3 * 2 * B * WIDTH * VOCAB
    assert tally.flops - head_flops == 5 * 2 * B * WIDTH * WIDTH  # the blocks: 2 forward, 3 backward (x needs none)
    peak, bandwidth = 989e12, 3.35e12
    assert 0 < tally.head_s(peak, bandwidth) < tally.time_s(peak, bandwidth)


def test_tiny_run_prints_a_ratio_per_family(every_part_project):
    done = run(
        [sys.executable, str(SCRIPT), "--tiny", "--project", str(every_part_project), "--gpu", "A100"], timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    finals = [FINAL_LINE.match(line) for line in lines[-3:]]
    assert all(finals), lines[-3:]
    assert [m.group(1) for m in finals] == ["gpt tiny", "gpt3 tiny", "bert tiny"]
    for m in finals:
        ours, peer, ratio = (float(g) for g in m.group(2, 3, 4))
        assert ours > 0 and peer > 0 and ratio == pytest.approx(ours / peer, rel=0.01)
    # every model's table row: the estimate is at least the matmul-only bound
    rows = [line.split() for line in lines if line.startswith(("ours ", "peer "))]
    assert len(rows) == 6
    assert all(float(row[-2]) >= 1.0 for row in rows), rows  # est/matmul
