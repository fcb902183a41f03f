"""bench/gpu_throughput.py runs end to end: `--cpu-smoke` trains every smoke row (DDP, DeepSpeed ZeRO-1,
BERT) through the generated project's real `train`, runs the BERT plain-loop reference in its own
process, prints figures for each and writes the results file; and the `compiled` column's reading of
torch's dynamo log matches what this torch writes.

    .venv/bin/python -m pytest -q tests/test_gpu_bench.py      # about 1 minute on 2 cores
"""

from __future__ import annotations

import os
import re
import sys

from conftest import BIN, TEMPLATE, run

BENCH = TEMPLATE / "bench"
sys.path.insert(0, str(BENCH))

import gpu_throughput  # noqa: E402


def test_cpu_smoke_prints_every_row_and_writes_the_results(tmp_path, every_part_project):
    results = tmp_path / "results.md"
    cmd = [str(BIN / "python"), str(BENCH / "gpu_throughput.py"), "--cpu-smoke", "--steps", "4"]
    done = run(cmd + ["--project", str(every_part_project), "--out", str(results)], cwd=BENCH, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    rows = [*gpu_throughput.CPU_SMOKE, "bert tiny plain loop"]
    # console columns: row, compiled, tokens/s, MFU, ratio to reference, goal (two or more spaces apart)
    printed = {cols[0]: cols for cols in (re.split(r"\s{2,}", line.strip()) for line in done.stdout.splitlines())}
    for name in rows:
        assert name in printed, done.stdout
        assert "failed" not in printed[name], printed[name]
        compiled, tokens_per_sec = printed[name][1:3]
        assert compiled == "no", printed[name]  # the project compiles on CUDA only
        assert float(tokens_per_sec.replace(",", "")) > 0, printed[name]
    assert printed["bert tiny ddp"][4].endswith("x bert tiny plain loop"), printed["bert tiny ddp"]
    assert printed["gpt3 tiny zero1"][4].endswith("x gpt tiny"), printed["gpt3 tiny zero1"]
    assert f"results: {results}" in done.stdout
    text = results.read_text()
    assert "run.compile=false on every row" in text and "transformers " in text and "deepspeed " in text, text
    for name in rows:
        assert f"| {name} | no | " in text, text
    assert "warning" not in text and "failed" not in text, text


def test_compiled_column_reads_the_dynamo_log(tmp_path):
    """A module compiled on CPU (eager backend: no C++ compiler needed) is found in the log this torch
    writes with TORCH_LOGS=dynamo; the dropout kernel and DeepSpeed's helpers are not the model."""
    script = (
        "import torch; m = torch.compile(torch.nn.Linear(4, 4), backend='eager'); m(torch.ones(2, 4)).sum().backward()"
    )
    code, log = gpu_throughput.run_logged(
        [str(BIN / "python"), "-c", script], tmp_path, dict(os.environ), tmp_path / "log"
    )
    assert code == 0, log[-3000:]
    assert gpu_throughput.compiled_frames(log), log[-3000:]
    eager = (
        "I1126 01:45:03.674000 6265 torch/_dynamo/symbolic_convert.py:5335] [0/0] Step 1: torchdynamo start tracing "
        "_dropped /p/src/pkg/models/sample_dropout.py:91\n"
        "I1126 01:45:03.674000 6265 torch/_dynamo/symbolic_convert.py:5335] [1/0] Step 1: torchdynamo start tracing "
        "fn /v/site-packages/deepspeed/utils/torch.py:50\n"
    )
    assert gpu_throughput.compiled_frames(eager) == []
    assert gpu_throughput.last_message(eager + "ValueError: the real reason\n") == "ValueError: the real reason"


def test_model_comparison_imports_the_generated_package(default_project):
    """bench/gpt_vs_hf.py (the d12 row's model-only comparison) imports the project's modules by name:
    a module moved in the template must fail here, not on the GPU machine."""
    cmd = [str(BIN / "python"), str(BENCH / "gpt_vs_hf.py"), "--project", str(default_project)]
    cmd += ["--size", "tiny", "--vocab", "512", "--seq", "32", "--batch", "2", "--steps", "2", "--rounds", "1"]
    done = run(cmd + ["--warmup", "1"], cwd=BENCH, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    ratio = re.search(r"ratio ours/HF tokens/s: ([0-9.]+)x", done.stdout)
    assert ratio and float(ratio.group(1)) > 0, done.stdout


def test_quick_run_has_a_row_of_every_family_and_strategy():
    """--quick (a GPU lent for minutes) keeps one row of each family and each strategy, at fewer steps."""
    assert set(gpu_throughput.QUICK) <= set(gpu_throughput.GPU_ROWS)
    overrides = [gpu_throughput.GPU_ROWS[name][0] for name in gpu_throughput.QUICK]
    families = {gpu_throughput.option(o, "model.arch") for o in overrides}
    strategies = {
        (gpu_throughput.option(o, "run.strategy"), gpu_throughput.option(o, "deepspeed.zero_stage")) for o in overrides
    }
    assert families == {"gpt", "gpt3", "bert"}
    assert {(None, None), ("ddp", None), ("deepspeed", "1"), ("deepspeed", "2"), ("deepspeed", "3")} <= strategies
    assert gpu_throughput.parse_args(["--quick"]).steps < gpu_throughput.parse_args([]).steps
