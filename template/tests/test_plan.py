"""`plan`: parameter count, ZeRO model-state formulas against DeepSpeed's estimators, fit verdicts
and time estimates, through the functions and through the CLI.

    python -m pytest -q tests/test_plan.py

DeepSpeed must be importable (CPU is enough): DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed
"""

from __future__ import annotations

import json
import os

import pytest

DS_HINT = "deepspeed is needed for test_plan: DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed"


def deepspeed_estimators():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    except ImportError as exc:
        pytest.fail(f"{DS_HINT} ({exc})")
    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs


def config(pkg, *overrides):
    return pkg.config.load_config(None, list(overrides))


@pytest.mark.parametrize("size,kv", [("tiny", None), ("tiny", 1), ("d4", None), ("d12", 2)])
def test_param_count_and_flops_match_the_model(pkg, size, kv):
    cfg = config(pkg, f"model.size={size}", f"model.n_kv_head={'null' if kv is None else kv}",
                 "model.sequence_len=128", "data.vocab_size=512")
    model = pkg.models.build_model(cfg, 512)
    shape = pkg.rules.model_shape(size, kv)
    assert pkg.plan.num_params(shape, 512) == model.num_params()
    assert pkg.plan.flops_per_token(shape, 512, 128) == model.flops_per_token()
    biggest = max(p.numel() for p in model.parameters())
    assert pkg.plan.largest_layer_params(shape, 512) == biggest


@pytest.mark.parametrize("psi", [477_102_080, 5_637_144_576])
@pytest.mark.parametrize("gpus,nodes", [(8, 1), (8, 4), (1, 1), (4, 2)])
def test_zero_formulas_match_deepspeed(pkg, psi, gpus, nodes):
    """The ZeRO paper's figures per stage; DeepSpeed's estimators additionally count a 4 Psi/Nd fp32
    gradient partition (stage 2: exactly that difference) and, for stage 3, 4 bytes per parameter of
    the largest layer plus 2 Psi/Nd (its 18 Psi/Nd against the paper's 16 Psi/Nd)."""
    zero2, zero3 = deepspeed_estimators()
    nd = gpus * nodes
    states = lambda stage, **kw: pkg.plan.model_states(psi, stage, nd, **kw)  # noqa: E731
    gpu = lambda st: st["weights"] + st["grads"] + st["optimizer"]  # noqa: E731
    assert gpu(states(0)) == 16 * psi
    assert gpu(states(1)) == 4 * psi + 12 * psi / nd
    _, ds2 = zero2(psi, gpus, nodes, cpu_offload=False, additional_buffer_factor=1.5)
    assert int(gpu(states(2)) + 4 * psi / nd) in (ds2, ds2 - 1, ds2 + 1)  # int() rounding
    _, ds2_off = zero2(psi, gpus, nodes, cpu_offload=True)
    off = states(2, offload_optimizer=True)
    assert off["weights"] == ds2_off and off["host"] == 12 * psi / nd  # DeepSpeed also moves grads to CPU
    largest = 32768 * 1280
    _, ds3, largest_bytes = zero3(psi, largest, gpus, nodes, cpu_offload=False, cpu_offload_params=False)
    ours3 = gpu(states(3))
    assert ours3 == 16 * psi / nd
    assert largest_bytes == 4 * largest and abs(ds3 - (ours3 + 2 * psi / nd) - largest_bytes) <= 1
    _, ds3_off, _ = zero3(psi, largest, gpus, nodes, cpu_offload=True, cpu_offload_params=True)
    full = states(3, offload_optimizer=True, offload_params=True)
    assert full["weights"] == full["optimizer"] == 0 and ds3_off == 4 * largest
    assert full["host"] == 14 * psi / nd


def test_time_scales_with_nodes(pkg, cli):
    r = json.loads(cli("plan", "--json", "--mfu", "0.5").stdout)
    hours = [t["hours"] for t in r["time"]]
    assert [t["nodes"] for t in r["time"]] == [1, 2, 4, 8]
    for nodes, h in zip((1, 2, 4, 8), hours):
        assert h == pytest.approx(hours[0] / nodes)
    cfg = config(pkg)
    shape = pkg.rules.model_shape(cfg.model.size, cfg.model.n_kv_head)
    tokens = cfg.schedule.max_steps * cfg.batch.global_batch_size * cfg.model.sequence_len
    flops = tokens * pkg.plan.flops_per_token(shape, cfg.data.vocab_size, cfg.model.sequence_len)
    gpus = cfg.cluster.gpus_per_node
    _, peak = pkg.plan.gpu_spec(cfg.cluster.gpu_type)
    assert r["tokens"] == tokens
    assert hours[0] == pytest.approx(flops / (gpus * peak * 0.5) / 3600)
    assert r["time"][3]["gpu_hours"] == pytest.approx(r["time"][0]["gpu_hours"])


def test_d20_on_8_h100_fits_with_ddp(cli):
    proc = cli("plan", "--json", "model.size=d20", "model.sequence_len=2048", "batch.micro_batch_size=16",
               "cluster.nodes=1", "cluster.gpus_per_node=8", "cluster.gpu_type=h100-80gb", "data.vocab_size=32768",
               "run.strategy=ddp")
    r = json.loads(proc.stdout)
    m = r["memory"]
    assert r["zero_stage"] == 0 and m["params"] == 477_102_080
    assert m["weights"] + m["grads"] + m["optimizer"] == 16 * m["params"]
    assert m["total"] == 16 * m["params"] + m["activations"]
    assert m["usable"] == pytest.approx(0.9 * 80 * 1024**3)
    assert r["fits"] is (m["total"] <= m["usable"]) is True and r["suggestion"] is None


def test_oversized_does_not_fit_and_suggests(cli):
    args = ["model.size=d48", "cluster.gpu_type=rtx4090-24gb", "cluster.nodes=1", "cluster.gpus_per_node=1",
            "batch.global_batch_size=256", "batch.micro_batch_size=16"]
    r = json.loads(cli("plan", "--json", *args, expect=1).stdout)
    assert not r["fits"] and r["memory"]["total"] > r["memory"]["usable"]
    assert r["suggestion"]
    text = cli("plan", *args, expect=1).stdout
    assert "does NOT fit" in text and f"smallest change that fits: {r['suggestion']}" in text


def test_suggestion_is_the_first_that_fits(pkg, cli):
    """A d26 at micro 32 on a100-40gb: lowering the micro batch is tried first, and the suggested
    micro batch fits while twice that does not."""
    args = ["model.size=d26", "cluster.gpu_type=a100-40gb", "cluster.nodes=1", "cluster.gpus_per_node=8",
            "batch.global_batch_size=256", "batch.micro_batch_size=32"]
    r = json.loads(cli("plan", "--json", *args, expect=1).stdout)
    assert r["suggestion"].startswith("batch.micro_batch_size=")
    micro = int(r["suggestion"].split("=")[1].split()[0])
    assert json.loads(cli("plan", "--json", *args, f"batch.micro_batch_size={micro}").stdout)["fits"]
    assert not json.loads(cli("plan", "--json", *args, f"batch.micro_batch_size={micro * 2}",
                              expect=1).stdout)["fits"]


def test_cli_table_and_bad_options(cli):
    out = cli("plan").stdout
    for word in ("parameters", "weights", "grads", "optimizer", "activations, checkpointed", "verdict: fits",
                 "GPU-hours"):
        assert word in out
    assert "ZeRO stage 3" in cli("plan", "--zero-stage", "3").stdout
    bad = cli("plan", "--offload-params", expect=1)
    assert "--zero-stage 3" in bad.stderr
    unknown = cli("plan", "cluster.gpu_type=tpu", expect=1)
    assert "h100-80gb" in unknown.stderr


def test_deepspeed_options_move_states(cli):
    """--zero-stage 2 --offload-optimizer: the optimizer leaves the GPU for host memory; the flags
    that DeepSpeed does not accept together are refused."""
    r = json.loads(cli("plan", "--json", "--zero-stage", "2", "--offload-optimizer").stdout)
    m = r["memory"]
    assert r["zero_stage"] == 2 and r["offload_optimizer"] and m["optimizer"] == 0
    assert m["host"] == 12 * m["params"] / m["data_parallel"]
    assert "optimizer offload" in cli("plan", "--zero-stage", "2", "--offload-optimizer").stdout
    assert "--zero-stage" in cli("plan", "--zero-stage", "0", "--offload-optimizer", expect=1).stderr
