"""prepare-data against the tokenizer library itself, and its memory at two corpus sizes.

For 1, 2 and all usable cores (each run pinned to that many cores with sched_setaffinity):
- the library: the corpus's documents already in memory, `encode_batch_fast` and `encode_batch`
  over batches of 1024 documents with RAYON_NUM_THREADS = cores; its best is the reference;
- ours: `prepare-data --force data.tokenizer=<the same tokenizer>` of the generated project, end to end
  (start, reading, encoding, writing, fingerprint), workers chosen as a user gets them.
It prints tokens/s of both and ours / library. Then the peak memory of the whole process tree
(sampled every 50 ms) for: the corpus with the tokenizer trained, the corpus with a given tokenizer,
and the corpus repeated to about --large-gb (the same files linked under other names).

    python bench/prepare_data_speed.py                          # 66 MB of text from site-packages, ~1 GB repeated
    python bench/prepare_data_speed.py --corpus /data/raw --large-gb 0   # your own .jsonl files

The corpus, when not given, is made from the Python, Markdown, reStructuredText and text files of
this interpreter's site-packages (one document per file, shuffled with a fixed seed), so nothing is
downloaded; it is code-heavy, not web text: compare ratios, not absolute tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

from gpt_vs_hf import render_project

LIBRARY_LOOP = r"""
import json, os, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = []
for path in sys.argv[2:]:
    with open(path, encoding="utf-8") as f:
        docs += [json.loads(line)["text"] for line in f if line.strip()]
best = {}
for name in ("encode_batch_fast", "encode_batch"):
    encode = getattr(tok, name, None)
    if encode is None:
        continue
    started, tokens = time.perf_counter(), 0
    for i in range(0, len(docs), 1024):
        tokens += sum(len(e.ids) for e in encode(docs[i : i + 1024], add_special_tokens=False))
    best[name] = tokens / (time.perf_counter() - started)
print(json.dumps(best))
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--project", type=Path, help="an already generated project (default: render one)")
    p.add_argument("--corpus", type=Path, help="a .jsonl file or a folder of them (default: made from site-packages)")
    p.add_argument("--mb", type=float, default=66, help="size of the made corpus in MB (default 66)")
    p.add_argument("--large-gb", type=float, default=1.0, help="repeated corpus for the memory figure (0: skip)")
    p.add_argument("--vocab", type=int, default=32768)
    return p.parse_args()


def make_corpus(folder: Path, megabytes: float) -> list[Path]:
    root = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".md", ".rst", ".txt") and p.is_file())
    random.Random(0).shuffle(files)
    out, written = folder / "corpus.jsonl", 0
    with out.open("w", encoding="utf-8") as f:
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if len(text) >= 200:
                written += f.write(json.dumps({"text": text}) + "\n")
            if written >= megabytes * 1e6:
                break
    return [out]


def pinned(cores: int):
    chosen = sorted(os.sched_getaffinity(0))[:cores]
    return lambda: os.sched_setaffinity(0, chosen)


def peak_tree_rss(proc: subprocess.Popen, peak: list[int]) -> None:
    import psutil

    try:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            total = 0
            for p in [root, *root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            peak[0] = max(peak[0], total)
            time.sleep(0.05)
    except psutil.Error:
        pass


def prepare(project: Path, package: str, data_dir: Path, extra: list[str], cores: int) -> dict:
    cmd = [sys.executable, "-m", package, "prepare-data", f"data.dir={data_dir}", "data.raw=", "--force", *extra]
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    started, peak = time.perf_counter(), [0]
    proc = subprocess.Popen(
        cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pinned(cores)
    )
    sampler = threading.Thread(target=peak_tree_rss, args=(proc, peak), daemon=True)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - started
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out}{err}")
    meta = json.loads((data_dir / "meta.json").read_text())
    tokens = sum(s["tokens"] for split in ("train", "val") for s in meta[split])
    how = re.search(r"encoding ([\d,]+) tokens/s on (\d+) workers? x (\d+) threads?", out)
    return {
        "seconds": seconds,
        "tokens": tokens,
        "rate": tokens / seconds,
        "peak": peak[0],
        "encode_rate": float(how.group(1).replace(",", "")),
        "layout": f"{how.group(2)} x {how.group(3)}",
    }


def library(tokenizer: Path, files: list[Path], cores: int) -> dict:
    env = {**os.environ, "RAYON_NUM_THREADS": str(cores), "TOKENIZERS_PARALLELISM": "true"}
    done = subprocess.run(
        [sys.executable, "-c", LIBRARY_LOOP, str(tokenizer), *map(str, files)],
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=pinned(cores),
    )
    if done.returncode:
        raise SystemExit(f"library loop failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    project = args.project
    if project is None:
        project = work / "project"
        render_project(project, "HEAD")
    package = next((project / "src").glob("*/cli.py")).parent.name
    data = work / "data"
    (data / "raw").mkdir(parents=True)
    if args.corpus is None:
        files = make_corpus(data / "raw", args.mb)
    else:
        sources = sorted(args.corpus.glob("*.jsonl")) if args.corpus.is_dir() else [args.corpus]
        files = []
        for source in sources:
            (data / "raw" / source.name).symlink_to(source.resolve())
            files.append(data / "raw" / source.name)
    size = sum(f.stat().st_size for f in files)
    all_cores = len(os.sched_getaffinity(0))
    print(f"corpus: {len(files)} file(s), {size / 1e6:.1f} MB; {all_cores} usable cores; package {package}")

    trained = prepare(project, package, data, [f"data.vocab_size={args.vocab}", "data.tokenizer="], all_cores)
    tokenizer = work / "tokenizer.json"
    tokenizer.write_bytes((data / "tokenizer.json").read_bytes())
    print(
        f"with the tokenizer trained ({args.vocab:,} tokens): {trained['seconds']:.1f} s, {trained['tokens']:,} tokens, "
        f"peak RSS (process tree) {trained['peak'] / 2**20:,.0f} MiB"
    )

    given = [f"data.tokenizer={tokenizer}"]
    print(
        f"\n{'cores':>5} {'library best':>14} {'ours':>14} {'ours/library':>13} {'ours encoding':>14} {'workers x threads':>18} {'peak RSS':>9}"
    )
    peaks = {}
    for cores in sorted({1, min(2, all_cores), all_cores}):
        ref = library(tokenizer, files, cores)
        ours = prepare(project, package, data, given, cores)
        peaks[cores] = ours["peak"]
        best = max(ref.values())
        print(
            f"{cores:>5} {best:>14,.0f} {ours['rate']:>14,.0f} {ours['rate'] / best:>13.2f} {ours['encode_rate']:>14,.0f} "
            f"{ours['layout']:>18} {ours['peak'] / 2**20:>7,.0f}Mi   (library: "
            + ", ".join(f"{k} {v:,.0f}" for k, v in ref.items())
            + ")"
        )

    if args.large_gb > 0:
        copies = max(1, round(args.large_gb * 1e9 / size))
        large = work / "large"
        (large / "raw").mkdir(parents=True)
        for i in range(copies):
            for f in files:
                (large / "raw" / f"{i:03d}-{f.name}").symlink_to(f.resolve())
        big = prepare(project, package, large, given, all_cores)
        print(
            f"\n{copies * size / 1e9:.2f} GB ({copies} copies), tokenizer given, {all_cores} cores: {big['seconds']:.1f} s, "
            f"{big['rate']:,.0f} tokens/s, peak RSS {big['peak'] / 2**20:,.0f} MiB "
            f"(vs {peaks[all_cores] / 2**20:,.0f} MiB for {size / 1e6:.0f} MB: x{big['peak'] / peaks[all_cores]:.2f})"
        )


if __name__ == "__main__":
    main()
