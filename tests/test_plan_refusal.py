"""Copier refuses a layout that does not fit its GPUs, and every shipped preset renders and fits.

    python -m pytest -q tests/test_plan_refusal.py -s     # -s prints plan's line per preset

The post-generation task runs `python -m <slug> check --quiet`, which after the rules runs
plan's memory estimate for nodes x gpus_per_node of gpu_type. The presets are the seeds'
Megatron-DeepSpeed layouts (A100 40GB; 80GB for 13B, copier.yml's gpu_type default) and the
defaults of the other families (gpt d20 with DDP and bert large with ZeRO 3, both on H100).
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from conftest import BIN, TEMPLATE, copier_copy, render, run

PRESETS = [
    "125m-1gpu",
    "125m-2dp",
    "125m-4dp",
    "1.3b-4dp",
    "1.3b-8dp",
    "1.3b-4dp-4pp",
    "13b-4dp-4pp",
    "13b-4dp-8pp",
    "13b-4dp-4pp-4tp",
]


def answers(tmp_path, **extra) -> dict:
    return {
        "project_name": "Fit Run",
        "data_dir": str(tmp_path / "data"),
        "output_dir": str(tmp_path / "runs"),
        **extra,
    }


def test_presets_match_sizes():
    """The list here is the layouts copier offers (the gpt3 descriptor's), so a new preset cannot escape
    the fit test below."""
    sys.path.insert(0, str(TEMPLATE / "hooks"))
    import answers

    assert sorted(answers.layouts("gpt3")) == sorted([*PRESETS, "custom"])


def test_a_layout_that_does_not_fit_is_refused(tmp_path):
    """GPT-3 13B on one node of 8 V100 16GB with the custom layout's defaults (no tensor or pipeline
    split, ZeRO 1, micro batch 1): copier exits non-zero, prints plan's one line with the figures
    and the smallest change, shows no traceback from the check, and leaves no project behind."""
    dst = tmp_path / "big"
    result = copier_copy(
        dst,
        answers(
            tmp_path,
            model="gpt3",
            gpt3_layout="custom",
            model_size="13B",
            nodes=1,
            gpus_per_node=8,
            gpu_type="v100-16gb",
        ),
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    refusal = "Validation error for question 'gpu_type': gpu_type=v100-16gb: does not fit: "
    line = next((x for x in out.splitlines() if x.startswith(refusal)), None)  # one line: answer, why, fix
    assert line, out
    assert "gpt3 13B on 1 x 8 v100-16gb" in line and "GiB usable of 16 GiB" in line
    suggestion = line.split("; smallest change: ", 1)[1]
    assert "model.activation_checkpointing=true" in suggestion and "deepspeed.zero_stage=3" in suggestion
    assert "Traceback" not in out and not dst.exists()


@pytest.mark.parametrize(
    "name,data",
    [
        *[(p, {"model": "gpt3", "gpt3_layout": p}) for p in PRESETS],
        ("gpt-default", {}),
        ("bert-default", {"model": "bert"}),
    ],
)
def test_presets_render_and_fit(tmp_path, name, data):
    project = render(tmp_path / "p", **answers(tmp_path, **data))
    proc = run(
        [str(BIN / "python"), "-m", "fitrun", "plan", "--json"], cwd=project, env={"PYTHONPATH": str(project / "src")}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    m, gib = r["memory"], 1024**3
    assert r["fits"] and m["problems"] == []
    if name.startswith("13b"):
        assert r["gpu_type"] == "a100-80gb"
    elif data.get("model") == "gpt3":
        assert r["gpu_type"] == "a100-40gb"
    print(
        f"{name}: {r['arch']} {r['model']} on {r['nodes']} x {r['gpus_per_node']} {r['gpu_type']}, tensor "
        f"{m['tensor']} x pipeline {m['pipeline']} x data {m['data_parallel']}, {r['strategy']}, micro "
        f"{r['micro_batch_size']}: {m['total'] / gib:.1f} of {m['usable'] / gib:.0f} GiB; {r['tokens']:.3g} tokens "
        f"at MFU {r['mfu']}: " + ", ".join(f"{t['nodes']} node(s) {t['hours']:.1f} h" for t in r["time"])
    )


def test_scaling_rows_take_the_micro_batch_copier_renders_for_more_nodes(tmp_path):
    """gpt's recipe (micro batch 16, global batch 256) on 2 nodes of 8: plan's strong-scaling rows for
    4 and 8 nodes, where 16 x 32 and 16 x 64 outgrow 256, are real rows whose micro batch and
    accumulation are what a project rendered with nodes=4 and nodes=8 holds in config/train.yaml."""
    shape = {"nodes": 2, "gpus_per_node": 8, "global_batch_size": 256}
    project = render(tmp_path / "p2", **answers(tmp_path, **shape))
    proc = run(
        [str(BIN / "python"), "-m", "fitrun", "plan", "--json"], cwd=project, env={"PYTHONPATH": str(project / "src")}
    )
    rows = json.loads(proc.stdout)["scaling"]["rows"]
    assert [row["nodes"] for row in rows] == [2, 4, 8]
    for row in rows:
        rendered = render(tmp_path / f"p{row['nodes']}", **answers(tmp_path, **{**shape, "nodes": row["nodes"]}))
        text = (rendered / "config" / "train.yaml").read_text()
        batch = yaml.safe_load(text)["batch"]
        strong = row["strong"]
        assert strong["problem"] is None
        assert (batch["global_batch_size"], batch["micro_batch_size"]) == (256, strong["micro_batch_size"])
        accum_note = f"{strong['grad_accum_steps']} on {row['nodes']} x 8 GPUs"
        assert f"grad_accum_steps: null # null = global / (micro x data-parallel size): {accum_note}" in text
    assert [row["strong"]["micro_batch_size"] for row in rows] == [16, 8, 4]
