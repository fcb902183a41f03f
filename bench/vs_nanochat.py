"""Learning per token: the generated project's gpt family against nanochat's own code, on CPU.

Both sides get the same text, its documents split once into train and validation. The default
corpus (`--corpus packages`, about 22M characters) is the docstrings of Python's standard library and
of torch, transformers, sympy, networkx, numpy, huggingface_hub and pandas, each paragraph kept once,
so no run here reads any text twice; `--corpus demo` is the project's demo corpus (the standard
library's docstrings alone, 1 MB: read twice by a 600K-token run). Each trains its own BPE tokenizer of the same size
on the train documents and then its own model of the same depth, sequence length, batch in tokens
and number of steps (so equal tokens), uncompiled, one process. Each checkpoint is then scored on the
WHOLE validation text the same way: every validation document tokenised by its side's tokenizer with
a BOS in front, the documents joined into one stream, cut into rows of sequence_len + 1 tokens, and
the summed loss over the summed UTF-8 bytes of the predicted tokens (bits per byte: fair across
tokenizers). Printed: bpb of each run, its smoothed training loss at the end in the same unit (the
debiased EMA nanochat prints, over per-step losses, divided by the side's bytes per token on the
validation text: a gap between the two tells generalising worse from learning less), its ms per step,
and the differences against nanochat.

    python bench/vs_nanochat.py --nanochat /path/to/nanochat --nanochat-python /path/to/venv/bin/python
    python bench/vs_nanochat.py ... --depth 4 6 --batch-tokens 1024 2048 --tokens 409600 1228800 --jobs 2
    python bench/vs_nanochat.py ... --depth 4 --tokens 200000 600000 --ours "shipped=" \
        --ours "adamw=optim.optimizer=adamw optim.lr=3e-4 schedule.decay=cosine"

--ours NAME=OVERRIDES (repeatable) trains one of our runs per entry with those key=value overrides on
top of the project's config/train.yaml (the shipped recipe when empty). nanochat runs with its own
defaults (its CPU command: --window-pattern=L, no compile: TORCHDYNAMO_DISABLE=1). Nothing is
downloaded; nanochat's Python needs torch, pyarrow, rustbpe, tiktoken (and what its scripts import).
The project is rendered from this template with copier (or give --project PATH). Hours on 2 cores
for the full table; --tokens 20000 checks the script in a few minutes. --jobs N trains N runs at once
(one thread each): times per step are then only comparable between runs that overlapped.
--seeds S [S ...] trains every run once per seed (ours through run.seed, nanochat's initialisation by
redirecting the one torch.manual_seed(42) it calls) and adds each side's mean and spread: at these
sizes one run's bpb moves by up to 0.03 with nanochat's seed, more than most differences measured.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.util
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "transformers", "sympy", "networkx", "numpy", "huggingface_hub", "pandas")
EMA_BETA = 0.9  # nanochat's smoothing of the training loss it prints


def package_docstrings(file_docstrings, packages=PACKAGES, min_chars: int = 100) -> list[str]:
    """The docstrings (the project's demo_corpus.file_docstrings: parsed, nothing imported) of the
    standard library and `packages`, each paragraph kept the first time it is seen (generated and
    copied docstrings repeat them), tests left out. A package that is not installed is named and
    skipped."""
    roots = [Path(sysconfig.get_paths()["stdlib"])]
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            print(f"corpus: {name} is not installed here, left out", flush=True)
            continue
        roots.append(Path(spec.origin).parent)
    skip = {"test", "tests", "testing", "site-packages", "dist-packages", "idlelib"}
    seen, docs = set(), []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if skip & set(path.relative_to(root).parts):
                continue
            for doc in file_docstrings(path):
                kept = []
                for paragraph in doc.split("\n\n"):
                    key = hashlib.sha1(" ".join(paragraph.split()).encode()).digest()
                    if key not in seen:
                        seen.add(key)
                        kept.append(paragraph)
                if len(text := "\n\n".join(kept)) >= min_chars:
                    docs.append(text)
    return docs


def score_stream(model, encode_docs, bos: int, token_bytes, docs: list[str], seq: int) -> tuple[float, float]:
    """Bits per byte of `docs` under `model(idx, targets, loss_reduction="none")`, scored as the
    module docstring says (the same function for both sides), and the bytes per predicted token."""
    import torch

    stream = []
    for ids in encode_docs(docs):
        stream += [bos, *ids]
    rows = [stream[i : i + seq + 1] for i in range(0, len(stream) - 1, seq)]
    nats, nbytes, ntokens = 0.0, 0, 0
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
            ntokens += int((b > 0).sum())
    return nats / nbytes / math.log(2), nbytes / ntokens


def smoothed(losses: list[float]) -> float:
    """The debiased EMA of the per-step training losses at the last step (nanochat's)."""
    ema = 0.0
    for loss in losses:
        ema = EMA_BETA * ema + (1 - EMA_BETA) * loss
    return ema / (1 - EMA_BETA ** len(losses))


def print_score(bpb_and_bytes: tuple[float, float]) -> None:
    print(f"BPB {bpb_and_bytes[0]:.6f} BPT {bpb_and_bytes[1]:.6f}")


def parse_score(out: str) -> tuple[float, float]:
    m = re.search(r"BPB ([0-9.]+) BPT ([0-9.]+)", out)
    return float(m.group(1)), float(m.group(2))


def median_ms(times: list[float], seconds: float, steps: int) -> float:
    return sorted(times)[len(times) // 2] if times else seconds * 1000 / steps


# --- nanochat's side (run in its own Python, with its checkout on the path) -------------------------


def nanochat_score(base_dir: str, val_path: str, seq: int) -> None:
    import torch
    from nanochat.checkpoint_manager import load_model
    from nanochat.tokenizer import get_token_bytes

    torch.set_num_threads(1)
    model, tokenizer, _ = load_model("base", torch.device("cpu"), phase="eval")
    docs = json.loads(Path(val_path).read_text())
    print_score(
        score_stream(
            lambda x, y, loss_reduction: model(x, y, loss_reduction=loss_reduction),
            lambda texts: tokenizer.encode(texts),
            tokenizer.get_bos_token_id(),
            get_token_bytes("cpu"),
            docs,
            seq,
        )
    )


def nanochat_tokenizer(args, work: Path, train_docs, val_docs) -> Path:
    """One tokenizer for every nanochat run (trained once on the train documents), and the data shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shared = work / "nanochat-shared"
    if not (shared / "tokenizer" / "tokenizer.pkl").is_file():
        data = shared / "base_data_climbmix"
        data.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": train_docs}), data / "shard_00000.parquet")
        pq.write_table(pa.table({"text": val_docs}), data / "shard_00001.parquet")  # the last shard: validation
        subprocess.run(
            [args.nanochat_python, "-m", "scripts.tok_train", f"--vocab-size={args.vocab}"],
            cwd=args.nanochat, env=nanochat_env(shared), check=True, capture_output=True,
        )  # fmt: skip
    return shared


def nanochat_env(base: Path) -> dict:
    return {**os.environ, "NANOCHAT_BASE_DIR": str(base), "TORCHDYNAMO_DISABLE": "1", "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "disabled"}  # fmt: skip


NANOCHAT_SEED = 42  # the torch.manual_seed nanochat's compute_init sets: its weights' initialisation


def seeded(train: list[str], seed: int | None) -> list[str]:
    """nanochat's training command with its initialisation seeded by `seed`: nanochat has no flag for
    it, so its one torch.manual_seed(42) call is redirected from outside, its code left as it is."""
    if seed is None or seed == NANOCHAT_SEED:
        return train
    code = (
        "import runpy, sys, torch; real = torch.manual_seed; "
        f"torch.manual_seed = lambda s: real({seed} if s == {NANOCHAT_SEED} else s); "
        f"sys.argv = ['base_train', *{train[3:]!r}]; runpy.run_module('scripts.base_train', run_name='__main__')"
    )
    return [train[0], "-c", code]


def run_name(side: str, depth: int, rows: int, steps: int, seed: int | None) -> str:
    return f"{side}-d{depth}-b{rows}-{steps}" + ("" if seed is None else f"-s{seed}")


def run_nanochat(args, work: Path, shared: Path, val_path: Path, depth: int, rows: int, steps: int,
                 seed: int | None = None) -> dict:  # fmt: skip
    base = work / run_name("nanochat", depth, rows, steps, seed)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    for name in ("base_data_climbmix", "tokenizer"):
        (base / name).symlink_to(shared / name)
    env, py, cwd = nanochat_env(base), args.nanochat_python, args.nanochat
    train = [
        py, "-m", "scripts.base_train", "--device-type=cpu", f"--depth={depth}", f"--max-seq-len={args.seq}",
        "--window-pattern=L", f"--device-batch-size={rows}", f"--total-batch-size={rows * args.seq}",
        f"--num-iterations={steps}", "--core-metric-every=-1", "--sample-every=-1", "--eval-every=-1",
    ]  # fmt: skip
    started = time.perf_counter()
    out = subprocess.run(seeded(train, seed), cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - started
    (base / "train.log").write_text(out)  # its per-step losses, beside ours in metrics.jsonl
    times = [float(m) for m in re.findall(r"dt: ([0-9.]+)ms", out)]
    smooth = [float(m) for m in re.findall(r"\| loss: ([0-9.]+)", out)]
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import vs_nanochat as b; b.nanochat_score({str(base)!r}, {str(val_path)!r}, {args.seq})"
    bpb, bpt = parse_score(
        subprocess.run([py, "-c", code], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout
    )
    return {"bpb": bpb, "train_bpb": smooth[-1] / math.log(2) / bpt, "ms": median_ms(times, seconds, steps)}


# --- our side -------------------------------------------------------------------------------------


def render_project(work: Path) -> Path:
    dest = work / "project"
    if not dest.is_dir():
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


def ours_score(src: str, package: str, out: str, data: str, val_path: str, seq: int) -> None:
    import importlib

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, src)
    config = importlib.import_module(f"{package}.settings.config")
    trained = importlib.import_module(f"{package}.evaluation.trained_model")
    tokens = importlib.import_module(f"{package}.data.tokens")
    cfg = config.load_config(str(Path(out) / "config.yaml"), [])
    model = trained.load_trained_model(cfg, None, torch.device("cpu"))[0].eval()
    tok = tokens.load_tokenizer(Path(data) / "tokenizer.json")
    print_score(
        score_stream(
            lambda x, y, loss_reduction: model(x, y, loss_reduction=loss_reduction),
            lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)],
            tokens.bos_id(tok),
            torch.from_numpy(tokens.token_byte_lengths(tok)),
            json.loads(Path(val_path).read_text()),
            seq,
        )
    )


def run_ours(args, project: Path, work: Path, data: Path, val_path: Path, depth: int, rows: int, steps: int,
             overrides: str, name: str, seed: int | None = None) -> dict:  # fmt: skip
    package = next((project / "src").glob("*/cli.py")).parent.name
    out = work / run_name(f"ours-{name}", depth, rows, steps, seed)
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    settings = [
        f"data.dir={data}", f"run.output_dir={out}", f"model.size=d{depth}", f"model.sequence_len={args.seq}",
        f"batch.global_batch_size={rows}", f"batch.micro_batch_size={rows}", f"schedule.max_steps={steps}",
        "run.device=cpu", "run.dtype=fp32", "run.compile=false", "logging.eval_every_steps=0", "logging.tensorboard=false",
        "logging.every_steps=1", f"checkpoint.every_steps={steps}", "eval.tasks_every_steps=0",
        "cluster.nodes=1", "cluster.gpus_per_node=1",
    ]  # fmt: skip
    seed_setting = [] if seed is None else [f"run.seed={seed}"]
    cmd = [sys.executable, "-m", package, "train", *settings, *seed_setting, *overrides.split()]
    started = time.perf_counter()
    log = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    if log.returncode:
        raise SystemExit(f"our run {name} failed:\n{log.stdout[-3000:]}\n{log.stderr[-3000:]}")
    seconds = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = [r["loss"] for r in records if "loss" in r]
    times = [1000 * r["step_time"] for r in records if "step_time" in r]
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import vs_nanochat as b; b.ours_score({str(project / 'src')!r}, {package!r}, {str(out)!r}, {str(data)!r}, {str(val_path)!r}, {args.seq})"
    bpb, bpt = parse_score(
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    )
    return {"bpb": bpb, "train_bpb": smoothed(losses) / math.log(2) / bpt, "ms": median_ms(times, seconds, steps)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nanochat", required=True, help="a nanochat checkout (no network needed)")
    p.add_argument("--nanochat-python", required=True, help="a Python with nanochat's dependencies")
    p.add_argument("--project", help="a generated project (default: render one from this template)")
    p.add_argument("--corpus", choices=("packages", "demo"), default="packages")
    p.add_argument("--depth", type=int, nargs="+", default=[4])
    p.add_argument("--tokens", type=int, nargs="+", default=[204_800, 614_400], help="training tokens per run")
    p.add_argument("--batch-tokens", type=int, nargs="+", default=[1024], help="tokens a step (rows of --seq)")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--val-docs", type=float, help="share of documents held out (default 0.01; demo 0.05)")
    p.add_argument("--ours", action="append", default=None, help="NAME=OVERRIDES: one of our runs (repeatable)")
    p.add_argument("--skip-nanochat", action="store_true")
    p.add_argument(
        "--skip-ours", action="store_true", help="nanochat's runs only (ours can follow with --skip-nanochat)"
    )
    p.add_argument("--seeds", type=int, nargs="+", help="train every run once per seed (ours: run.seed; nanochat: "
                   "its initialisation's); the table adds each side's mean and spread")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once, one thread each")
    p.add_argument("--work", help="keep the runs here (default: a temporary folder)")
    args = p.parse_args(argv)
    runs = {} if args.skip_ours else dict(entry.split("=", 1) for entry in (args.ours or ["shipped="]))

    work = Path(args.work or tempfile.mkdtemp(prefix="vs-nanochat-"))
    work.mkdir(parents=True, exist_ok=True)
    project = Path(args.project) if args.project else render_project(work)
    package = next((project / "src").glob("*/cli.py")).parent.name
    sys.path.insert(0, str(project / "src"))
    demo_corpus = importlib.import_module(f"{package}.data.demo_corpus")
    docs = list(
        demo_corpus.stdlib_docstrings() if args.corpus == "demo" else package_docstrings(demo_corpus.file_docstrings)
    )
    random.Random(0).shuffle(docs)
    held = max(1, int(len(docs) * (args.val_docs or (0.05 if args.corpus == "demo" else 0.01))))
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
    shared = None if args.skip_nanochat else nanochat_tokenizer(args, work, train_docs, val_docs)
    chars = sum(map(len, train_docs))
    print(f"{args.corpus} corpus: {len(train_docs)} train documents ({chars / 1e6:.1f}M characters), {len(val_docs)} "
          f"validation ({sum(map(len, val_docs)) / 1e6:.2f}M); vocab {args.vocab}, sequence {args.seq}", flush=True)  # fmt: skip

    seeds = args.seeds or [None]
    jobs = []  # (key, side, seed, callable)
    for depth in args.depth:
        for batch in args.batch_tokens:
            rows = batch // args.seq
            for tokens in args.tokens:
                steps = max(1, tokens // batch)
                key = (depth, batch, steps * batch)
                for seed in seeds:
                    if shared is not None:
                        jobs.append((key, "nanochat", seed, lambda d=depth, r=rows, s=steps, e=seed: run_nanochat(
                            args, work, shared, val_path, d, r, s, e)))  # fmt: skip
                    for name, overrides in runs.items():
                        jobs.append((key, f"ours {name}", seed, lambda d=depth, r=rows, s=steps, o=overrides, n=name, e=seed: run_ours(
                            args, project, work, data, val_path, d, r, s, o, n, e)))  # fmt: skip

    header = f"{'run':<26}{'depth':>6}{'batch':>7}{'tokens':>11}{'val bpb':>9}{'train~':>8}{'ms/step':>9}{'bpb vs nc':>11}{'time vs nc':>11}"
    print(header, flush=True)
    results: dict = {}

    def mean(key, side) -> dict | None:
        """A side's runs at one point over the seeds: mean bpb, train~ and ms, and the bpb's spread."""
        done = [results[(k, s, e)] for k, s, e, _ in jobs if (k, s) == (key, side) and (k, s, e) in results]
        if not done:
            return None
        average = {m: sum(r[m] for r in done) / len(done) for m in ("bpb", "train_bpb", "ms")}
        return {**average, "spread": max(r["bpb"] for r in done) - min(r["bpb"] for r in done), "runs": len(done)}

    def show(key, label, r, reference):
        ratios = f"{r['bpb'] - reference['bpb']:>+11.4f}{r['ms'] / reference['ms']:>10.2f}x" if reference else ""
        print(f"{label:<26}{key[0]:>6}{key[1]:>7}{key[2]:>11,}{r['bpb']:>9.4f}{r['train_bpb']:>8.4f}{r['ms']:>9.0f}{ratios}", flush=True)  # fmt: skip

    def label(side, seed):
        return side if seed is None else f"{side} s{seed}"

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(fn): (key, side, seed) for key, side, seed, fn in jobs}
        for future in concurrent.futures.as_completed(futures):
            key, side, seed = futures[future]
            results[(key, side, seed)] = future.result()
            print(f"done: {label(side, seed)} d{key[0]} batch {key[1]} {key[2]:,} tokens", flush=True)
    print(header)
    # Against nanochat's mean at the point: its seeds are not ours, so runs are not paired by seed.
    for key, side, seed, _ in jobs:
        show(key, label(side, seed), results[(key, side, seed)], None if side == "nanochat" else mean(key, "nanochat"))
    if len(seeds) > 1:
        print(f"means over {len(seeds)} seeds (spread: largest minus smallest bpb)")
        for key, side in dict.fromkeys((k, s) for k, s, _, _ in jobs):
            m = mean(key, side)
            show(key, f"{side} ({m['spread']:.4f})", m, None if side == "nanochat" else mean(key, "nanochat"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
