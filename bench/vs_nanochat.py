"""Learning per token: the generated project's gpt family against nanochat's own code, on CPU.

Both sides get the same text: the demo corpus (docstrings of Python's standard library), its
documents split once into train and validation. Each trains its own BPE tokenizer of the same size
on the train documents and then its own model of the same depth, sequence length, batch in tokens
and number of steps (so equal tokens), uncompiled, one process. Each checkpoint is then scored on the
WHOLE validation text the same way: every validation document tokenised by its side's tokenizer with
a BOS in front, the documents joined into one stream, cut into rows of sequence_len + 1 tokens, and
the summed loss over the summed UTF-8 bytes of the predicted tokens (bits per byte: fair across
tokenizers). Printed: bpb of each run, its ms per step, and the ratios against nanochat.

    python bench/vs_nanochat.py --nanochat /path/to/nanochat --nanochat-python /path/to/venv/bin/python
    python bench/vs_nanochat.py ... --depth 4 --tokens 200000 600000 --ours "shipped=" \
        --ours "adamw=optim.optimizer=adamw optim.lr=3e-4 schedule.decay=cosine"

--ours NAME=OVERRIDES (repeatable) trains one of our runs per entry with those key=value overrides on
top of the project's config/train.yaml (the shipped recipe when empty). nanochat runs with its own
defaults (its CPU command: --window-pattern=L, no compile: TORCHDYNAMO_DISABLE=1). Nothing is
downloaded; nanochat's Python needs torch, pyarrow, rustbpe, tiktoken (and what its scripts import).
The project is rendered from this template with copier (or give --project PATH). Hours on 2 cores
for the full table; --tokens 20000 checks the script in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH_ROWS = 4  # sequences per step on both sides (one micro batch)


def score_stream(model, encode_docs, bos: int, token_bytes, docs: list[str], seq: int) -> float:
    """Bits per byte of `docs` under `model(idx, targets, loss_reduction="none")`, scored as the
    module docstring says (the same function for both sides)."""
    import torch

    stream = []
    for ids in encode_docs(docs):
        stream += [bos, *ids]
    rows = [stream[i : i + seq + 1] for i in range(0, len(stream) - 1, seq)]
    nats, nbytes = 0.0, 0
    with torch.no_grad():
        for row in rows:
            if len(row) < 2:
                continue
            x = torch.tensor([row[:-1]])
            y = torch.tensor([row[1:]])
            loss = model(x, y, loss_reduction="none").view(-1).double()
            b = token_bytes[y.view(-1)].double()
            nats += float((loss * (b > 0)).sum())
            nbytes += int(b.sum())
    return nats / nbytes / 0.6931471805599453


# --- nanochat's side (run in its own Python, with its checkout on the path) -------------------------


def nanochat_score(base_dir: str, val_path: str, seq: int) -> None:
    import torch
    from nanochat.checkpoint_manager import load_model
    from nanochat.tokenizer import get_token_bytes

    model, tokenizer, _ = load_model("base", torch.device("cpu"), phase="eval")
    docs = json.loads(Path(val_path).read_text())
    bpb = score_stream(
        lambda x, y, loss_reduction: model(x, y, loss_reduction=loss_reduction),
        lambda texts: tokenizer.encode(texts),
        tokenizer.get_bos_token_id(),
        get_token_bytes("cpu"),
        docs,
        seq,
    )
    print(f"BPB {bpb:.6f}")


def run_nanochat(args, work: Path, train_docs, val_path: Path, depth: int, steps: int) -> tuple[float, float]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = work / f"nanochat-d{depth}-{steps}"
    shutil.rmtree(base, ignore_errors=True)
    data = base / "base_data_climbmix"
    data.mkdir(parents=True)

    pq.write_table(pa.table({"text": train_docs}), data / "shard_00000.parquet")
    val_docs = json.loads(val_path.read_text())
    pq.write_table(pa.table({"text": val_docs}), data / "shard_00001.parquet")  # the last shard: validation
    env = {
        **os.environ,
        "NANOCHAT_BASE_DIR": str(base),
        "TORCHDYNAMO_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
    }
    py, cwd = args.nanochat_python, args.nanochat
    subprocess.run(
        [py, "-m", "scripts.tok_train", f"--vocab-size={args.vocab}"], cwd=cwd, env=env, check=True, capture_output=True
    )
    train = [
        py, "-m", "scripts.base_train", "--device-type=cpu", f"--depth={depth}", f"--max-seq-len={args.seq}",
        "--window-pattern=L", f"--device-batch-size={BATCH_ROWS}", f"--total-batch-size={BATCH_ROWS * args.seq}",
        f"--num-iterations={steps}", "--core-metric-every=-1", "--sample-every=-1", "--eval-every=-1",
    ]  # fmt: skip
    started = time.perf_counter()
    out = subprocess.run(train, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - started
    times = [float(m) for m in re.findall(r"dt: ([0-9.]+)ms", out)]
    ms = sorted(times)[len(times) // 2] if times else seconds * 1000 / steps
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import vs_nanochat as b; b.nanochat_score({str(base)!r}, {str(val_path)!r}, {args.seq})"
    scored = subprocess.run([py, "-c", code], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout
    return float(re.search(r"BPB ([0-9.]+)", scored).group(1)), ms


# --- our side -------------------------------------------------------------------------------------


def render_project(work: Path) -> Path:
    dest = work / "project"
    subprocess.run(
        [
            "copier",
            "copy",
            "--trust",
            "--defaults",
            "--vcs-ref=HEAD",
            "--data",
            "project_name=Bench",
            str(ROOT),
            str(dest),
        ],
        check=True,
        capture_output=True,
    )
    return dest


def run_ours(args, project: Path, work: Path, data: Path, val_docs, depth: int, steps: int, overrides: str, name: str):
    package = next((project / "src").glob("*/cli.py")).parent.name
    out = work / f"ours-{name}-d{depth}-{steps}"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    settings = [
        f"data.dir={data}", f"run.output_dir={out}", f"model.size=d{depth}", f"model.sequence_len={args.seq}",
        f"batch.global_batch_size={BATCH_ROWS}", f"batch.micro_batch_size={BATCH_ROWS}", f"schedule.max_steps={steps}",
        "run.device=cpu", "run.dtype=fp32", "run.compile=false", "logging.eval_every_steps=0", "logging.tensorboard=false",
        f"logging.every_steps={max(1, steps // 20)}", f"checkpoint.every_steps={steps}", "eval.tasks_every_steps=0",
        "cluster.nodes=1", "cluster.gpus_per_node=1",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", package, "train", *settings, *overrides.split()]
    started = time.perf_counter()
    log = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    if log.returncode:
        raise SystemExit(f"our run {name} failed:\n{log.stdout[-3000:]}\n{log.stderr[-3000:]}")
    seconds = time.perf_counter() - started
    times = [float(m) for m in re.findall(r"([0-9.]+) ms/step", log.stdout)]
    ms = sorted(times)[len(times) // 2] if times else seconds * 1000 / steps

    sys.path.insert(0, str(project / "src"))
    import importlib

    import torch

    config = importlib.import_module(f"{package}.settings.config")
    trained = importlib.import_module(f"{package}.evaluation.trained_model")
    tokens = importlib.import_module(f"{package}.data.tokens")
    cfg = config.load_config(str(out / "config.yaml"), [])
    model = trained.load_trained_model(cfg, None, torch.device("cpu"))[0].eval()
    tok = tokens.load_tokenizer(data / "tokenizer.json")
    token_bytes = torch.from_numpy(tokens.token_byte_lengths(tok))
    bpb = score_stream(
        lambda x, y, loss_reduction: model(x, y, loss_reduction=loss_reduction),
        lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)],
        tokens.bos_id(tok),
        token_bytes,
        val_docs,
        args.seq,
    )
    return bpb, ms


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nanochat", required=True, help="a nanochat checkout (no network needed)")
    p.add_argument("--nanochat-python", required=True, help="a Python with nanochat's dependencies")
    p.add_argument("--project", help="a generated project (default: render one from this template)")
    p.add_argument("--depth", type=int, nargs="+", default=[4])
    p.add_argument("--tokens", type=int, nargs="+", default=[200_000, 600_000], help="training tokens per run")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--val-docs", type=float, default=0.05, help="share of documents held out for scoring")
    p.add_argument("--ours", action="append", default=None, help="NAME=OVERRIDES: one of our runs (repeatable)")
    p.add_argument("--skip-nanochat", action="store_true")
    p.add_argument("--work", help="keep the runs here (default: a temporary folder)")
    args = p.parse_args(argv)
    runs = dict(entry.split("=", 1) for entry in (args.ours or ["shipped="]))

    work = Path(args.work or tempfile.mkdtemp(prefix="vs-nanochat-"))
    work.mkdir(parents=True, exist_ok=True)
    project = Path(args.project) if args.project else render_project(work)
    package = next((project / "src").glob("*/cli.py")).parent.name
    sys.path.insert(0, str(project / "src"))
    import importlib

    docs = list(importlib.import_module(f"{package}.data.demo_corpus").stdlib_docstrings())
    random.Random(0).shuffle(docs)
    held = max(1, int(len(docs) * args.val_docs))
    val_docs, train_docs = docs[:held], docs[held:]
    val_path = work / "val_docs.json"
    val_path.write_text(json.dumps(val_docs))
    raw = work / "raw"
    raw.mkdir(exist_ok=True)
    (raw / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in train_docs))
    data = work / "ours-data"
    if not (data / "meta.json").is_file():
        env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
        prepare = [sys.executable, "-m", package, "prepare-data", f"data.dir={data}", f"data.raw={raw}/*.jsonl",
                   f"data.vocab_size={args.vocab}", "data.val_fraction=0.01"]  # fmt: skip
        subprocess.run(prepare, cwd=project, env=env, check=True, capture_output=True)
    print(f"{len(train_docs)} train and {len(val_docs)} validation documents; vocab {args.vocab}, sequence {args.seq}, "
          f"{BATCH_ROWS * args.seq} tokens a step", flush=True)  # fmt: skip

    print(f"{'run':<28}{'depth':>6}{'tokens':>10}{'val bpb':>10}{'ms/step':>10}{'bpb vs nc':>11}{'time vs nc':>11}")
    for depth in args.depth:
        for tokens in args.tokens:
            steps = max(1, tokens // (BATCH_ROWS * args.seq))
            ref = None
            if not args.skip_nanochat:
                ref = run_nanochat(args, work, train_docs, val_path, depth, steps)
                print(
                    f"{'nanochat':<28}{depth:>6}{steps * BATCH_ROWS * args.seq:>10,}{ref[0]:>10.4f}{ref[1]:>10.0f}",
                    flush=True,
                )
            for name, overrides in runs.items():
                bpb, ms = run_ours(args, project, work, data, val_docs, depth, steps, overrides, name)
                ratios = f"{bpb - ref[0]:>+11.4f}{ms / ref[1]:>10.2f}x" if ref else ""
                print(
                    f"{'ours ' + name:<28}{depth:>6}{steps * BATCH_ROWS * args.seq:>10,}{bpb:>10.4f}{ms:>10.0f}{ratios}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
