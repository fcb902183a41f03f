"""Training throughput and MFU of the generated project's real `train` command, against references
in the same run, on one GPU (bf16):

    GPT d12, d20               our train loop (DDP strategy, compiled)
    GPT d12 model only         ours vs transformers' GPT2LMHeadModel at d12's dims (bench/gpt_vs_hf.py)
    GPT-3 125M, 350M           DDP and DeepSpeed ZeRO 1, 2, 3 (ZeRO-3's cost against ZeRO-1 printed)
    BERT-large MLM, seq 512    our strategy (DDP and ZeRO-1) vs the same model in a plain loop with
                               torch's fused AdamW (this script, in process)

Each row runs `python -m <package> train` in a fresh process with schedule.max_steps=--steps and reads
its metrics.jsonl (tokens/s and MFU, both computed by the project: metrics.py), taking the median of
the steps after the first third (compilation and warm-up). Ratios are against the row named in the
last column, measured in this run.

    python bench/gpu_throughput.py                          # every row, about 15 minutes on one H100
    python bench/gpu_throughput.py --only gpt3 --steps 30   # rows whose name contains "gpt3"
    python bench/gpu_throughput.py --cpu-smoke              # tiny sizes on CPU: checks the script runs

Needs torch with CUDA, transformers, deepspeed, copier (or --project), and a prepared data folder
(--data, --bert-data; default: made from site-packages text, bench/prepare_data_speed.py's corpus, 8 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpt_vs_hf import render_project
from prepare_data_speed import make_corpus

# name -> (overrides, reference row name or None)
GPU_ROWS = {
    "gpt d12": (["model.arch=gpt", "model.size=d12", "model.sequence_len=1024", "batch.micro_batch_size=32"], None),
    "gpt d20": (
        ["model.arch=gpt", "model.size=d20", "model.sequence_len=1024", "batch.micro_batch_size=16"],
        "gpt d12",
    ),
    **{
        f"gpt3 {size} {name}": (
            [
                "model.arch=gpt3",
                f"model.size={size}",
                "model.sequence_len=2048",
                f"batch.micro_batch_size={micro}",
                *how,
            ],
            None if name == "ddp" else f"gpt3 {size} ddp",
        )
        for size, micro in (("125M", 16), ("350M", 8))
        for name, how in (
            ("ddp", ["run.strategy=ddp"]),
            ("zero1", ["run.strategy=deepspeed", "deepspeed.zero_stage=1"]),
            ("zero2", ["run.strategy=deepspeed", "deepspeed.zero_stage=2"]),
            ("zero3", ["run.strategy=deepspeed", "deepspeed.zero_stage=3"]),
        )
    },
    "bert large ddp": (
        [
            "model.arch=bert",
            "model.size=large",
            "model.sequence_len=512",
            "batch.micro_batch_size=32",
            "run.strategy=ddp",
        ],
        "bert large plain loop",
    ),
    "bert large zero1": (
        ["model.arch=bert", "model.size=large", "model.sequence_len=512", "batch.micro_batch_size=32"]
        + ["run.strategy=deepspeed", "deepspeed.zero_stage=1"],
        "bert large plain loop",
    ),
}
CPU_SMOKE = {
    "gpt tiny": (["model.arch=gpt", "model.size=tiny", "model.sequence_len=64", "batch.micro_batch_size=4"], None),
    "gpt3 tiny zero1": (
        ["model.arch=gpt3", "model.size=tiny", "model.sequence_len=64", "batch.micro_batch_size=4"]
        + ["run.strategy=deepspeed", "deepspeed.zero_stage=1"],
        "gpt tiny",
    ),
    "bert tiny ddp": (
        ["model.arch=bert", "model.size=tiny", "model.sequence_len=64", "batch.micro_batch_size=4", "run.strategy=ddp"],
        "bert tiny plain loop",
    ),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--project", type=Path, help="an already generated project (default: render one)")
    p.add_argument("--data", type=Path, help="a data folder prepared for gpt/gpt3 (default: made here)")
    p.add_argument("--bert-data", type=Path, help="a data folder prepared with model.arch=bert (default: made here)")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per row (default 40)")
    p.add_argument("--only", default="", help="run only the rows whose name contains this")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU, fp32: checks that the script runs")
    p.add_argument("--extra", nargs="*", default=[], help="overrides for every row, e.g. run.compile=false")
    return p.parse_args()


def train_row(project: Path, package: str, data: Path, overrides: list[str], steps: int, out: Path) -> dict:
    micro = next(int(o.split("=")[1]) for o in overrides if o.startswith("batch.micro_batch_size="))
    cmd = [
        sys.executable, "-m", package, "train", f"data.dir={data}", f"run.output_dir={out}",
        "model.pretrained=", f"batch.global_batch_size={micro}", "batch.grad_accum_steps=null",
        f"schedule.max_steps={steps}", "schedule.warmup_steps=1", "logging.every_steps=1",
        "logging.eval_every_steps=0", "logging.tensorboard=false", f"checkpoint.every_steps={10 * steps}",
        "checkpoint.resume=false", "cluster.nodes=1", "cluster.gpus_per_node=1", *overrides,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    done = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    if done.returncode:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1][:200]}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = [r for r in records if "tokens_per_sec" in r][len(records) // 3 :]
    mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
    return {
        "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in steady),
        "mfu": statistics.median(mfus) if mfus else None,
    }


def bert_plain_loop(size: str, seq: int, micro: int, steps: int, device: str, vocab: int) -> dict:
    """BertForMaskedLM in the plainest training loop: bf16 autocast, fused AdamW, 15% of tokens masked."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    dims = {"large": (24, 1024, 16), "base": (12, 768, 12), "tiny": (2, 64, 2)}[size]  # sizes.py BERT_SIZES
    config = BertConfig(num_hidden_layers=dims[0], hidden_size=dims[1], num_attention_heads=dims[2],
                        intermediate_size=4 * dims[1], vocab_size=vocab, max_position_embeddings=512,
                        attn_implementation="sdpa")  # fmt: skip
    model = BertForMaskedLM(config).to(device)
    cuda = device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    gen = torch.Generator(device="cpu").manual_seed(0)
    times = []
    for _ in range(steps):
        ids = torch.randint(0, config.vocab_size, (micro, seq), generator=gen).to(device)
        labels = torch.where(torch.rand(ids.shape, generator=gen).to(device) < 0.15, ids, -100)
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    step = statistics.median(times[len(times) // 3 :])
    params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * params + 12 * dims[0] * dims[1] * seq
    tokens_per_sec = micro * seq / step
    peak = 989e12 if cuda and "H100" in torch.cuda.get_device_name() else None
    return {"tokens_per_sec": tokens_per_sec, "mfu": flops_per_token * tokens_per_sec / peak if peak else None}


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    project = args.project or work / "project"
    if args.project is None:
        render_project(project, "HEAD")
    package = next((project / "src").glob("*/train.py")).parent.name
    prepared = {"gpt": args.data, "bert": args.bert_data}

    def data_for(overrides: list[str]) -> Path:
        """The data folder of the row's family (bert needs WordPiece with BERT's special tokens)."""
        family = "bert" if "model.arch=bert" in overrides else "gpt"
        if prepared[family] is None:
            folder = work / f"data-{family}"
            (folder / "raw").mkdir(parents=True)
            make_corpus(folder / "raw", 2 if args.cpu_smoke else 8)
            env = {**os.environ, "PYTHONPATH": str(project / "src")}
            subprocess.run([sys.executable, "-m", package, "prepare-data", f"data.dir={folder}", "data.raw=",
                            f"data.vocab_size={30522 if family == 'bert' else 8192}", f"model.arch={family}", "model.pretrained="],
                           cwd=project, env=env, check=True, capture_output=True)  # fmt: skip
            prepared[family] = folder
        return prepared[family]

    rows = CPU_SMOKE if args.cpu_smoke else GPU_ROWS
    extra = ["run.device=cpu", "run.dtype=fp32", *args.extra] if args.cpu_smoke else ["run.compile=true", *args.extra]
    results: dict[str, dict] = {}
    print(f"{'row':<24} {'tokens/s':>12} {'MFU':>7}  ratio to reference")
    for name, (overrides, reference) in rows.items():
        if args.only not in name:
            continue
        out = work / name.replace(" ", "-")
        results[name] = train_row(project, package, data_for(overrides), [*overrides, *extra], args.steps, out)
        if reference and reference.endswith("plain loop") and reference not in results:
            size, seq, micro = name.split()[1], 64 if args.cpu_smoke else 512, 4 if args.cpu_smoke else 32
            vocab = json.loads((data_for(overrides) / "meta.json").read_text())["vocab_size"]  # the same model
            device = "cpu" if args.cpu_smoke else "cuda"
            results[reference] = bert_plain_loop(size, seq, micro, args.steps, device, vocab)
            show(reference, results[reference], None, results)
        show(name, results[name], reference, results)
    if not args.cpu_smoke and "gpt d12" in args.only + "gpt d12":
        print("\nGPT d12, model only, ours vs transformers' GPT2LMHeadModel (bench/gpt_vs_hf.py):", flush=True)
        subprocess.run([sys.executable, str(Path(__file__).with_name("gpt_vs_hf.py")), "--project", str(project),
                        "--size", "d12", "--vocab", "8192", "--seq", "1024", "--batch", "32", "--steps", "30", "--compile"])  # fmt: skip


def show(name: str, row: dict, reference: str | None, results: dict) -> None:
    if "error" in row:
        print(f"{name:<24} failed: {row['error']}", flush=True)
        return
    mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "-"
    ratio = ""
    if reference in results and "tokens_per_sec" in results[reference]:
        ratio = f"{row['tokens_per_sec'] / results[reference]['tokens_per_sec']:.2f}x {reference}"
    print(f"{name:<24} {row['tokens_per_sec']:>12,.0f} {mfu:>7}  {ratio}", flush=True)


if __name__ == "__main__":
    main()
