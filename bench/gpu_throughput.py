"""Training throughput and MFU of the generated project's real `train` command, against references
in the same run, on one GPU (bf16):

    GPT d12, d20               our train loop (DDP strategy)
    GPT d12 model only         ours vs transformers' GPT2LMHeadModel at d12's dims (bench/gpt_vs_hf.py)
    GPT-3 125M, 350M           DDP and DeepSpeed ZeRO 1, 2, 3 (each ZeRO row's ratio is to DDP's)
    FSDP2                      gpt d20, GPT-3 125M against their DDP rows; BERT-large against the loop
    BERT-large MLM, seq 512    our strategy (DDP, FSDP2 and ZeRO-1) vs the same model in a plain loop (below)

Each row runs `python -m <package> train` in a fresh process with schedule.max_steps=--steps,
logging every --log-every steps, and reads its metrics.jsonl (tokens/s and MFU, both computed by the
project: metrics.py), taking the median of the logged windows after the first third (compilation
and warm-up). Ratios are tokens/s against the row named in the last column, measured in this run.

Compilation: --compile (the default on a GPU) passes run.compile=true to every row, ZeRO rows
included, and compiles the reference loop's model; --no-compile passes run.compile=false. The
project compiles on CUDA only. Every row runs with TORCH_LOGS=dynamo and its column `compiled`
says whether torch.compile traced its model (a frame other than the per-sample dropout kernel,
which models/sample_dropout.py compiles on CUDA whatever run.compile says); a run whose rows differ
gets a warning, as their ratios compare unlike work.

The BERT reference ("plain loop", run in its own process): transformers' BertForMaskedLM of the
same size and vocabulary (attn_implementation="sdpa", hidden dropout 0.1 as config.json's default,
attention-probability dropout 0 as the project's model.attention_dropout=null), trained in the
plainest loop that does the project's work. Each step it draws the batch on the host (random token
ids; K = predictions_per_sequence(seq) = max(1, round(0.15 x seq)) distinct positions per row, 80%
of them replaced by a mask id, 10% by a random token, 10% kept), moves ids, positions and labels to
the device, runs the encoder under bf16 autocast, gathers the K hidden states of each row
(hidden.gather), runs the vocabulary head (model.cls) on those alone, takes the cross-entropy,
backward, clips the global gradient norm to 1.0 and steps torch's fused AdamW (the project's lr,
betas and eps; weight decay 0.1 on every parameter). The loss is read (.item(), a sync) once per
--log-every steps, as the project's logging does, and all of that is inside the timed window. With
--compile the module doing encoder, gather, head and loss goes through torch.compile, as the
project's model does. Its MFU uses the project's own BERT FLOPs-per-token formula (models/bert/model.py)
and peak FLOP/s (metrics.peak_flops).

The table goes to stdout and, with the date, GPU, versions (torch, CUDA, transformers, deepspeed),
template revision and each row's MFU goal (one H100, bf16: GPT d12 >= 45%, d20 >= 50%, GPT-3 125M
>= 40%, BERT-large >= 40%) marked met or not, to --out (default bench/results/gpu-<date>.md).

    bash bench/run_gpu_bench.sh                             # fresh GPU machine: venv, install, every row
    python bench/gpu_throughput.py                          # every row (first timed on an H200: bench/README.md)
    python bench/gpu_throughput.py --only gpt3 --steps 30   # rows whose name contains "gpt3"
    python bench/gpu_throughput.py --quick                  # one row per family and strategy, 20 steps each
    python bench/gpu_throughput.py --cpu-smoke              # tiny sizes on CPU: checks the script runs

Needs torch with CUDA, transformers, deepspeed, copier (or --project), and a prepared data folder
per tokenizer kind of the rows' families (--data: BPE, gpt and gpt3; --bert-data: WordPiece, bert;
default: made from site-packages text, bench/prepare_data_speed.py's corpus, 8 MB, prepared for the
longest sequence of the rows that use it).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpt_vs_hf import TEMPLATE_ROOT, render_project
from prepare_data_speed import make_corpus

# name -> (overrides, reference row name or None)
GPT_D20 = ["model.arch=gpt", "model.size=d20", "model.sequence_len=1024", "batch.micro_batch_size=16"]
GPT3_125M_DDP = ["model.arch=gpt3", "model.size=125M", "model.sequence_len=2048", "batch.micro_batch_size=16"]
GPT3_125M_DDP += ["run.strategy=ddp"]
GPU_ROWS = {
    "gpt d12": (["model.arch=gpt", "model.size=d12", "model.sequence_len=1024", "batch.micro_batch_size=32"], None),
    "gpt d20": (GPT_D20, "gpt d12"),
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
    # FSDP2 against DDP on the same model (one GPU: what sharding's gathers and hooks cost).
    "gpt d20 fsdp": ([*GPT_D20, "run.strategy=fsdp"], "gpt d20"),
    "gpt d20 fsdp fp8 tensorwise": ([*GPT_D20, "run.strategy=fsdp", "run.fp8=tensorwise"], "gpt d20 fsdp"),
    "gpt3 125M fsdp": ([*GPT3_125M_DDP, "run.strategy=fsdp"], "gpt3 125M ddp"),
    # run.fp8 against the same row in bf16 (Hopper and newer; compiled, as the rows are by default).
    **{
        f"{row} fp8 {recipe}": ([*overrides, f"run.fp8={recipe}"], row)
        for row, overrides in (("gpt d20", GPT_D20), ("gpt3 125M ddp", GPT3_125M_DDP))
        for recipe in ("tensorwise", "rowwise")
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
    "bert large fsdp": (
        ["model.arch=bert", "model.size=large", "model.sequence_len=512", "batch.micro_batch_size=32"]
        + ["run.strategy=fsdp"],
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
# --quick: one row per family and strategy (the BERT loop joins as its rows' reference), fp8 on and
# off, 20 steps each: what a GPU lent for minutes can give unattended. (A pipeline needs two GPUs.)
QUICK = (
    *("gpt d20", "gpt d20 fp8 tensorwise", "gpt3 125M ddp", "gpt3 125M ddp fp8 tensorwise"),
    *("gpt3 125M zero1", "gpt3 125M zero2", "gpt3 125M zero3", "bert large zero1"),
    *("gpt d20 fsdp", "gpt3 125M fsdp", "bert large fsdp"),
)
QUICK_STEPS = 20
PLAIN_LOOP = " plain loop"  # suffix of the in-house reference rows' names: "bert <size> plain loop"
# The vocabulary prepare-data trains per tokenizer kind (a family's descriptor names its kind):
# BERT's WordPiece size, and 8192 for BPE.
VOCAB_SIZES = {"bpe": 8192, "wordpiece": 30522}
# MFU goals on one H100 in bf16, by the model a row trains (every strategy's row of it is marked).
GOALS = {"gpt d12": 0.45, "gpt d20": 0.50, "gpt3 125M": 0.40, "bert large": 0.40}
# glog-style lines torch's logging writes ("I1126 01:45:03.674000 6265 torch/...] ...").
TORCH_LOG_LINE = re.compile(r"^[DIWEC]\d{4} \d\d:\d\d:\d\d")
TRACED_FRAME = re.compile(r"torchdynamo start tracing (\S+) (\S+):\d+")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--project", type=Path, help="an already generated project (default: render one)")
    p.add_argument("--data", type=Path, help="a data folder prepared with BPE, e.g. for gpt (default: made here)")
    p.add_argument(
        "--bert-data", type=Path, help="a data folder prepared with WordPiece, e.g. for bert (default: made here)"
    )
    p.add_argument("--steps", type=int, help=f"optimizer steps per row (default 40; {QUICK_STEPS} with --quick)")
    p.add_argument(
        "--quick", action="store_true", help="one row per family and strategy, fewer steps: " + ", ".join(QUICK)
    )
    p.add_argument(
        "--log-every",
        type=int,
        help="steps per timed window: logging.every_steps of the rows, loss read by the reference "
        "(default 5 on a GPU, 1 with --cpu-smoke)",
    )
    p.add_argument("--only", default="", help="run only the rows whose name contains this")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU, fp32: checks that the script runs")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="run.compile=true (false) on every row, reference loop included (default: on a GPU, on; with --cpu-smoke, off)",
    )
    p.add_argument("--out", type=Path, help="the results file (default bench/results/gpu-<date>.md)")
    p.add_argument("--extra", nargs="*", default=[], help="overrides for every row, e.g. optim.grad_clip=0")
    p.add_argument(
        "--keep-work",
        action="store_true",
        help="keep the temporary folder (project, data, each row's output and log); kept anyway when a row fails",
    )
    p.add_argument("--bert-reference", help=argparse.SUPPRESS)  # internal: the reference loop's own process
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else 40
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.compile is None:
        args.compile = not args.cpu_smoke
    if args.log_every is None:
        args.log_every = 1 if args.cpu_smoke else 5
    if args.log_every < 1:
        p.error("--log-every must be at least 1")
    return args


def option(overrides: list[str], key: str) -> str | None:
    """The value of key=value in overrides (the last one wins, as the project reads them)."""
    values = [o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}=")]
    return values[-1] if values else None


def project_families(project: Path, package: str) -> dict:
    """The generated project's model families by name: their descriptors (models/family.py, no torch)."""
    sys.path.insert(0, str(project / "src"))
    return importlib.import_module(f"{package}.models.family").families()


def unread_model_settings(package: str, arch: str) -> list[str]:
    """The model settings family `arch` does not read, at their defaults: the rendered project's train.yaml
    holds its own family's switches, which `train` refuses on another family (planning/rules.py)."""
    rules = importlib.import_module(f"{package}.planning.rules")
    defaults = importlib.import_module(f"{package}.settings.config").ModelConfig()
    written = {True: "true", False: "false", None: "null"}
    return [
        f"model.{name}={written.get(value, value) if isinstance(value, (bool, type(None))) else value}"
        for name, value in vars(defaults).items()
        if name not in rules.family_settings(arch)
    ]


def compiled_frames(log: str) -> list[str]:
    """The frames torch.compile traced, from a TORCH_LOGS=dynamo log ("name file"), without the
    per-sample dropout kernel that models/sample_dropout.py compiles on CUDA whatever run.compile
    says and without DeepSpeed's helpers: what is left is the model (torch.compile(module) shows as
    torch's wrapper frame, module.compile() as nn.Module's _call_impl, graph breaks as model code)."""
    frames = []
    for name, path in TRACED_FRAME.findall(log):
        if (name == "_dropped" and path.endswith("sample_dropout.py")) or "/deepspeed/" in path:
            continue  # the dropout kernel; DeepSpeed's own helpers are not the model either
        if f"{name} {path}" not in frames:
            frames.append(f"{name} {path}")
    return frames


def last_message(text: str) -> str:
    """The last error line of a failed row's output (else its last line), torch's log lines aside."""
    lines = [line for line in text.strip().splitlines() if line.strip() and not TORCH_LOG_LINE.match(line)]
    errors = [line for line in lines if re.search(r"\w(Error|Exception)\b|^error:", line.removeprefix("[rank0]: "))]
    return (errors or lines or ["(no output)"])[-1][:300]


def steady_median(values: list[float]) -> float:
    """Median of the values after the first third (compilation and warm-up)."""
    return statistics.median(values[len(values) // 3 :])


def run_logged(cmd: list[str], cwd: Path, env: dict, log: Path) -> tuple[int, str]:
    """Run cmd with TORCH_LOGS=dynamo; its whole output goes to log. Returns (exit code, output)."""
    done = subprocess.run(cmd, cwd=cwd, env={**env, "TORCH_LOGS": "dynamo"}, capture_output=True, text=True)
    text = done.stdout + done.stderr
    log.write_text(text)
    return done.returncode, text


def train_row(
    project: Path, package: str, data: Path, overrides: list[str], steps: int, log_every: int, out: Path
) -> dict:
    micro = int(option(overrides, "batch.micro_batch_size"))
    cmd = [
        sys.executable, "-m", package, "train", f"data.dir={data}", f"run.output_dir={out}",
        "model.pretrained=", f"batch.global_batch_size={micro}", "batch.grad_accum_steps=null",
        f"schedule.max_steps={steps}", "schedule.warmup_steps=1", f"logging.every_steps={log_every}",
        "logging.eval_every_steps=0", "logging.eval_batches=1", "logging.tensorboard=false",
        f"checkpoint.every_steps={10 * steps}", "checkpoint.resume=false", "cluster.nodes=1",
        "cluster.gpus_per_node=1", *overrides,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    log = out.with_name(out.name + ".log")
    code, text = run_logged(cmd, project, env, log)
    frames = compiled_frames(text)
    if code:
        return {"error": f"{last_message(text)} (log: {log})", "compiled": bool(frames)}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # The run's final checkpoint (written after its last timed window): GBs per row at these sizes.
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    timed = [r for r in records if "tokens_per_sec" in r]
    mfus = [r["mfu"] for r in timed[len(timed) // 3 :] if r.get("mfu") is not None]
    return {
        "tokens_per_sec": steady_median([r["tokens_per_sec"] for r in timed]),
        "mfu": statistics.median(mfus) if mfus else None,
        "compiled": bool(frames),
        "frames": frames,
    }


def reference_row(
    project: Path, package: str, spec: dict, work: Path, name: str
) -> dict:  # the plain loop in its own process: its GPU memory and compiled graphs leave with it
    cmd = [sys.executable, str(Path(__file__).resolve()), "--bert-reference", json.dumps(spec)]
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    log = work / (name.replace(" ", "-") + ".log")
    code, text = run_logged(cmd, Path(__file__).resolve().parent, env, log)
    frames = compiled_frames(text)
    result = [line for line in text.splitlines() if line.startswith("RESULT ")]
    if code or not result:
        return {"error": f"{last_message(text)} (log: {log})", "compiled": bool(frames)}
    return {**json.loads(result[-1][len("RESULT ") :]), "compiled": bool(frames), "frames": frames}


def bert_plain_loop(
    package: str, size: str, seq: int, micro: int, vocab: int, steps: int, log_every: int, device: str, compile: bool
) -> dict:
    """BertForMaskedLM trained in a plain loop doing the project's work (see the module's docstring):
    {"tokens_per_sec", "mfu"}, medians over the windows of log_every steps after the first third."""
    import torch
    import torch.nn.functional as F

    # The project's own definitions: K per row, the shape of a size, FLOPs per token, peak FLOP/s.
    bert = importlib.import_module(f"{package}.models.bert.model")
    metrics = importlib.import_module(f"{package}.training.metrics")
    transformers = bert.import_transformers()  # offline: the model is built from a config, nothing downloads
    config = bert.scratch_config(
        size, vocab, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0, attn_implementation="sdpa"
    )
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM(config).to(dev)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # as the project's train does
    k = bert.predictions_per_sequence(seq)

    class PredictedPositionsLoss(torch.nn.Module):
        """Encoder, the K given positions of each row gathered, vocabulary head on those, cross-entropy."""

        def __init__(self, mlm: torch.nn.Module):
            super().__init__()
            self.mlm = mlm

        def forward(self, ids: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            hidden = self.mlm.bert(input_ids=ids).last_hidden_state
            picked = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.size(-1)))
            logits = self.mlm.cls(picked).float()
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    module = PredictedPositionsLoss(mlm).train()
    runnable = torch.compile(module) if compile and cuda else module  # the project's rule: CUDA only
    optim = importlib.import_module(f"{package}.settings.config").OptimConfig()
    params = list(mlm.parameters())
    opt = torch.optim.AdamW(
        params,
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        fused=cuda,
    )
    gen = torch.Generator().manual_seed(0)
    mask_id, first_word = 4, 5  # ids below first_word stand for the special tokens

    def host_batch():
        ids = torch.randint(first_word, vocab, (micro, seq), generator=gen)
        positions = torch.rand(micro, seq, generator=gen).argsort(dim=1)[:, :k]
        labels = ids.gather(1, positions)
        draw = torch.rand(micro, k, generator=gen)
        random_ids = torch.randint(first_word, vocab, (micro, k), generator=gen)
        inputs = torch.where(draw < 0.8, mask_id, torch.where(draw < 0.9, random_ids, labels))
        return ids.scatter_(1, positions, inputs), positions, labels

    windows = []
    started = time.perf_counter()
    for step in range(steps):
        ids, positions, labels = (t.to(dev) for t in host_batch())
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = runnable(ids, positions, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, optim.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % log_every == 0 or step + 1 == steps:
            loss.item()  # waits for the device, as a logging step does
            now = time.perf_counter()
            windows.append(micro * seq * ((step % log_every) + 1) / (now - started))
            started = now
    tokens_per_sec = steady_median(windows)
    flops_per_token = bert.BertMLM(mlm, seq).flops_per_token()
    peak = metrics.peak_flops(dev, "bf16")
    return {"tokens_per_sec": tokens_per_sec, "mfu": flops_per_token * tokens_per_sec / peak if peak else None}


def environment(cpu_smoke: bool) -> dict:
    """Date, versions and the GPU, the GPU read in a child process (this one never touches CUDA)."""
    if cpu_smoke:
        info = {"torch": importlib.metadata.version("torch"), "cuda": None, "gpu": None, "gpus": 0}
    else:
        probe = (
            "import json, torch; c = torch.cuda.is_available(); "
            "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'available': c, "
            "'gpu': torch.cuda.get_device_name() if c else None, 'gpus': torch.cuda.device_count() if c else 0}))"
        )
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"error: cannot import torch: {last_message(done.stderr)}")
        info = json.loads(done.stdout.strip().splitlines()[-1])
        if not info["available"]:
            sys.exit(
                f"error: torch {info['torch']} sees no CUDA GPU (torch.cuda.is_available() is False); install "
                "a CUDA build of torch on a GPU machine (bench/run_gpu_bench.sh does), or run --cpu-smoke"
            )
    for name in ("transformers", "deepspeed", "copier"):
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = None
    git = subprocess.run(
        ["git", "-C", str(TEMPLATE_ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    info["template"] = git.stdout.strip() if git.returncode == 0 else "unknown (not a git checkout)"
    info["python"] = platform.python_version()
    info["date"] = datetime.datetime.now().astimezone().isoformat(timespec="minutes")
    return info


def goal_of(name: str) -> float | None:
    """The MFU goal of a train row's model (None: none set, or the reference loop)."""
    if name.endswith(PLAIN_LOOP):
        return None
    return next((goal for model, goal in GOALS.items() if name == model or name.startswith(model + " ")), None)


def cells(name: str, row: dict, reference: str | None, results: dict) -> list[str]:
    """row, compiled, tokens/s, MFU, ratio, goal: one table line's cells."""
    compiled = "yes" if row.get("compiled") else "no"
    if "error" in row:
        return [name, compiled, "failed", "-", "-", row["error"]]
    mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "-"
    ratio = "-"
    if reference in results and "tokens_per_sec" in results[reference]:
        ratio = f"{row['tokens_per_sec'] / results[reference]['tokens_per_sec']:.2f}x {reference}"
    goal, verdict = goal_of(name), "-"
    if goal is not None:
        met = row.get("mfu") is not None and row["mfu"] >= goal
        verdict = f">= {100 * goal:.0f}%: {'met' if met else 'not met'}"
    return [name, compiled, f"{row['tokens_per_sec']:,.0f}", mfu, ratio, verdict]


def goal_summary(results: dict, gpu: str | None) -> list[str]:
    """One line per MFU goal: met or not by the rows of its model that ran (or not run)."""
    lines = []
    for model, goal in GOALS.items():
        ran = {name: row for name, row in results.items() if goal_of(name) == goal}
        rows = {name: row for name, row in ran.items() if name == model or name.startswith(model + " ")}
        if not rows:
            continue
        mfus = {name: row.get("mfu") for name, row in rows.items()}
        shown = ", ".join(
            f"{name} {'failed' if 'error' in rows[name] else '-' if mfu is None else f'{100 * mfu:.1f}%'}"
            for name, mfu in mfus.items()
        )
        met = [name for name, mfu in mfus.items() if mfu is not None and mfu >= goal]
        verdict = "not met" if not met else "met" if len(met) == len(rows) else f"met by {', '.join(met)} only"
        lines.append(f"- {model} >= {100 * goal:.0f}% MFU: {verdict} ({shown})")
    if lines and gpu and "H100" not in gpu:
        lines.append(f"- (the goals are for one H100; this ran on {gpu})")
    return lines


HEADER = ["row", "compiled", "tokens/s", "MFU", "ratio to reference", "MFU goal (one H100, bf16)"]
WIDTHS = [22, 8, 12, 7, 30, 0]


def console_line(values: list[str]) -> str:
    return "  ".join(
        (v.rjust(w) if i in (2, 3) else v.ljust(w)) if w else v for i, (v, w) in enumerate(zip(values, WIDTHS))
    )


def markdown(
    args: argparse.Namespace, info: dict, results: dict, lines: list[list[str]], notes: list[str], model_only: str
) -> str:
    if args.cpu_smoke:
        device = "CPU (--cpu-smoke, fp32; no MFU)"
    else:
        device = (
            f"{info['gpu']} (bf16; one of {info['gpus']} GPUs used)" if info["gpus"] > 1 else f"{info['gpu']} (bf16)"
        )
    cuda = f" (CUDA {info['cuda']})" if info["cuda"] else ""
    versions = (
        f"torch {info['torch']}{cuda}, transformers {info['transformers']}, deepspeed {info['deepspeed']}, "
        f"Python {info['python']}"
    )
    text = [
        f"# Training throughput, {info['date']}",
        "",
        f"- device: {device}",
        f"- versions: {versions}",
        f"- template: {info['template']}",
        f"- each row: {args.steps} optimizer steps, one window per {args.log_every} steps, median of the windows "
        f"after the first third; run.compile={str(args.compile).lower()} on every row (the project compiles on "
        "CUDA only; `compiled` says whether torch.compile traced the row's model)",
        f"- command: `python bench/gpu_throughput.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---" if i in (0, 1, 4, 5) else "---:" for i in range(len(HEADER))) + "|",
        *("| " + " | ".join(v.replace("|", "\\|") for v in values) + " |" for values in lines),
    ]
    goals = goal_summary(results, info["gpu"])
    if goals:
        text += ["", "MFU goals, one H100 in bf16:", "", *goals]
    if notes:
        text += ["", *notes]
    if model_only:
        text += ["", "GPT d12, model only, ours vs transformers' GPT2LMHeadModel (bench/gpt_vs_hf.py):", "", "```"]
        text += [model_only.rstrip(), "```"]
    return "\n".join(text) + "\n"


def main() -> None:
    args = parse_args()
    if args.bert_reference:
        print("RESULT " + json.dumps(bert_plain_loop(**json.loads(args.bert_reference))), flush=True)
        return
    info = environment(args.cpu_smoke)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out_file = (
        args.out
        or Path(__file__).resolve().parent / "results" / f"{'cpu-smoke' if args.cpu_smoke else 'gpu'}-{stamp}.md"
    )
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    project = args.project or work / "project"
    if args.project is None:
        render_project(project, "HEAD", every_part=True)
    package = next((project / "src").glob("*/cli.py")).parent.name
    all_rows = CPU_SMOKE if args.cpu_smoke else GPU_ROWS
    rows = {
        name: row
        for name, row in all_rows.items()
        if args.only in name and (args.cpu_smoke or not args.quick or name in QUICK)
    }
    if not rows:
        sys.exit(f"error: no row's name contains {args.only!r}; rows: {', '.join(all_rows)}")
    common = [f"run.compile={str(args.compile).lower()}"]
    common += ["run.device=cpu", "run.dtype=fp32"] if args.cpu_smoke else ["run.dtype=bf16"]
    common += args.extra
    families = project_families(project, package)
    prepared = {"bpe": args.data, "wordpiece": args.bert_data}

    def family(overrides: list[str]):
        return families[option(overrides, "model.arch")]

    def data_for(overrides: list[str]) -> Path:
        """The data folder of the row's tokenizer kind (WordPiece carries BERT's special tokens),
        prepared for the longest sequence of the rows of that kind: prepare-data refuses a split that
        holds none (2% held out rather than 0.5%: the corpus has only a few thousand documents)."""
        kind = family(overrides).tokenizer
        if prepared[kind] is None:
            folder = work / f"data-{kind}"
            (folder / "raw").mkdir(parents=True)
            make_corpus(folder / "raw", 2 if args.cpu_smoke else 8)
            longest = max(int(option(o, "model.sequence_len")) for o, _ in rows.values() if family(o).tokenizer == kind)
            env = {**os.environ, "PYTHONPATH": str(project / "src")}
            cmd = [sys.executable, "-m", package, "prepare-data", f"data.dir={folder}", "data.raw=",
                   f"data.vocab_size={VOCAB_SIZES[kind]}", f"model.arch={family(overrides).name}",
                   "model.pretrained=", f"model.sequence_len={longest}", "data.val_fraction=0.02"]  # fmt: skip
            done = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"error: prepare-data for {kind} failed: {last_message(done.stdout + done.stderr)}")
            prepared[kind] = folder
        return prepared[kind]

    device = "cpu" if args.cpu_smoke else "cuda"
    print(f"{info['gpu'] or 'CPU'}: torch {info['torch']}, run.compile={str(args.compile).lower()} on every row")
    print(console_line(HEADER), flush=True)
    results: dict[str, dict] = {}
    lines: list[list[str]] = []

    def show(name: str, reference: str | None) -> None:
        lines.append(cells(name, results[name], reference, results))
        print(console_line(lines[-1]), flush=True)

    for name, (overrides, reference) in rows.items():
        data = data_for(overrides)
        if reference and reference.endswith(PLAIN_LOOP) and reference not in results:
            spec = {
                "package": package,
                "size": option(overrides, "model.size"),
                "seq": int(option(overrides, "model.sequence_len")),
                "micro": int(option(overrides, "batch.micro_batch_size")),
                "vocab": json.loads((data / "meta.json").read_text())["vocab_size"],  # the same model
                "steps": args.steps,
                "log_every": args.log_every,
                "device": device,
                "compile": args.compile,
            }
            results[reference] = reference_row(project, package, spec, work, reference)
            show(reference, None)
        out = work / name.replace(" ", "-")
        overrides = [*overrides, *common]
        if not family(overrides).muon or option(overrides, "run.strategy") == "deepspeed":
            overrides.append("optim.optimizer=adamw")  # Muon steps a muon family's named matrices, under DDP only
        overrides = [*unread_model_settings(package, family(overrides).name), *overrides]
        results[name] = train_row(project, package, data, overrides, args.steps, args.log_every, out)
        show(name, reference)

    notes = []
    compiled = {name for name, row in results.items() if row.get("compiled")}
    if compiled and compiled != set(results):
        notes.append(
            "warning: rows differ in compilation (compiled: "
            + ", ".join(sorted(compiled))
            + "; eager: "
            + ", ".join(sorted(set(results) - compiled))
            + "): their ratios compare unlike work"
        )
    elif args.compile and not args.cpu_smoke and not compiled:
        notes.append("warning: run.compile=true but no row compiled its model")
    failed = [name for name, row in results.items() if "error" in row]
    if failed:
        notes.append(f"failed: {', '.join(failed)} (each row's whole output: {work}/<row>.log)")
    for note in notes:
        print(note, flush=True)

    model_only = ""
    if not args.cpu_smoke and "gpt d12" in rows:
        print("\nGPT d12, model only, ours vs transformers' GPT2LMHeadModel (bench/gpt_vs_hf.py):", flush=True)
        cmd = [sys.executable, str(Path(__file__).with_name("gpt_vs_hf.py")), "--project", str(project),
               "--size", "d12", "--vocab", "8192", "--seq", "1024", "--batch", "32", "--steps", "30"]  # fmt: skip
        done = subprocess.run(cmd + (["--compile"] if args.compile else []), capture_output=True, text=True)
        model_only = done.stdout + (
            f"failed ({done.returncode}): {last_message(done.stderr)}\n" if done.returncode else ""
        )
        print(model_only, end="", flush=True)

    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(markdown(args, info, results, lines, notes, model_only))
    if failed or args.keep_work:
        print(f"\nthe rendered project, data and each row's output and log: {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nresults: {out_file}", flush=True)
    if failed:
        sys.exit(1)  # the table is written all the same


if __name__ == "__main__":
    main()
